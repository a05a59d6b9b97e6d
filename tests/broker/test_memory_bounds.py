"""Memory stays bounded under socket hostility: clients that send requests but never read
their answers are disconnected once their queued answers pass the bound (twice the frame
limit), many idle connections cost little, and the broker keeps serving everyone else."""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path

from tests.conftest import run_cli, start_broker, wait_for

FRAME_LIMIT = 65536
HOSTILE = 20
IDLE = 500


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _flood(sock: socket.socket, frames: int) -> bool:
    """Send ``frames`` pings without reading; True if the broker dropped us on the way."""
    body = json.dumps({"type": "ping", "request_id": 1}).encode()
    chunk = (struct.pack(">I", len(body)) + body) * 1000
    sock.settimeout(10)
    try:
        for _ in range(frames // 1000):
            sock.sendall(chunk)
    except OSError:
        return True
    return False


def test_never_reading_clients_are_dropped_and_memory_stays_bounded(
    cli_env: dict[str, str],
) -> None:
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    (home / "config.json").write_text(json.dumps({"max_frame_bytes": FRAME_LIMIT}))
    settings = start_broker(cli_env)
    pid = int((home / "broker.pid").read_text())
    before = _rss_kib(pid)

    idle = []
    hostile = []
    try:
        for _ in range(IDLE):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(settings.socket_path))
            idle.append(s)
        for _ in range(HOSTILE):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(settings.socket_path))
            hostile.append(s)
        # 200,000 pings each: ~7 MB of answers apiece if the broker queued them all
        dropped = [_flood(s, 200_000) for s in hostile]
        assert all(dropped), f"{dropped.count(False)} never-reading clients were kept"
        log = home / "broker.log"
        wait_for(lambda: "not reading" in log.read_text(), 10, "the drop to be logged")
        grown_mib = (_rss_kib(pid) - before) / 1024
        print(f"MEMORY-BOUND rss_growth_mib={grown_mib:.1f} idle={IDLE} hostile={HOSTILE}")
        assert grown_mib < 64, f"broker grew by {grown_mib:.1f} MiB"
        # everyone else is still served
        listed = run_cli(cli_env, "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert os.path.exists(f"/proc/{pid}")
    finally:
        for s in idle + hostile:
            s.close()
