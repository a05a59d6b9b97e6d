"""The broker socket's peer check (SO_PEERCRED): a process of another user is turned away and
logged even when the file modes would let it reach the socket; the owner is served."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, start_broker, wait_for

NOBODY = 65534
# Connects as another user and prints what the broker answered (or that it closed).
PROBE = r"""
import os, socket, struct, sys
os.setgroups([]); os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
body = b'{"type": "list", "request_id": 1}'
try:
    s.sendall(struct.pack(">I", len(body)) + body)
except OSError:
    pass
data = b""
try:
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
except OSError:
    pass
print(data[4:].decode(errors="replace"))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_is_refused_and_logged(cli_env: dict[str, str]) -> None:
    settings = start_broker(cli_env)
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    # A careless chmod opens the way to the socket; the peer check still holds.
    home.chmod(0o711)
    settings.socket_path.chmod(0o777)
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(settings.socket_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    assert "peer_not_allowed" in probe.stdout, probe.stdout
    assert '"sessions"' not in probe.stdout
    log = home / "broker.log"
    wait_for(lambda: f"uid {NOBODY}" in log.read_text(), 10, "the refusal to be logged")
    assert "connection refused" in log.read_text()
    # the owner is still served
    listed = run_cli(cli_env, "list", "--json")
    assert listed.returncode == 0, listed.stderr
