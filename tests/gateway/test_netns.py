"""A sandbox in a network namespace of its own (root only): a veth pair with a private /30 between
it and this machine, where only the gateway listens (on this side's address; every other service
here listens on loopback or a Unix socket, out of the namespace's reach). The CLI there sends
through the gateway and is woken by mail from host B."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, sessions, wait_for
from tests.gateway.conftest import start_gateway
from tests.pgtls import make_certificates
from tests.relay.conftest import (
    Cluster,
    sqlite_store,  # noqa: F401  (a fixture, found by name)
)

# A /30 used only between the namespace and this machine.
HERE, THERE = "10.213.7.1", "10.213.7.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace needs root and iproute2")
    name, veth = f"ci-gw-{os.getpid()}", f"cigw{os.getpid() % 100000}"
    try:
        _ip("netns", "add", name)
        _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}n")
        _ip("link", "set", f"{veth}n", "netns", name)
        _ip("addr", "add", f"{HERE}/30", "dev", veth)
        _ip("link", "set", veth, "up")
        _ip("-n", name, "addr", "add", f"{THERE}/30", "dev", f"{veth}n")
        _ip("-n", name, "link", "set", f"{veth}n", "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield name
    finally:  # always: the namespace goes, and with it the pair
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", veth], capture_output=True, check=False)


def test_a_sandbox_in_its_own_network_namespace_sends_and_is_woken(
    netns: str,
    sqlite_store: str,  # noqa: F811
) -> None:
    cluster = Cluster(sqlite_store)
    a, b = cluster.up("A", "B")
    root = Path(tempfile.mkdtemp(prefix="gw-", dir=cluster.root))
    certs = make_certificates(root, HERE)
    gw = start_gateway(a, root, certs, f"{HERE}:0", tls=True)
    try:
        env = gw.sandbox(gw.grant("worker"), CROSSINTERCOM_GATEWAY=f"https://{HERE}:{gw.port}")
        inside = ["ip", "netns", "exec", netns, *CLI]
        # Nothing of this machine's loopback is in reach from there (its store, its brokers).
        probe = subprocess.run(
            ["ip", "netns", "exec", netns, "ip", "-o", "addr"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert THERE in probe.stdout and HERE not in probe.stdout, probe.stdout
        lead = b.listen("lead")

        def send(via: str, text: str) -> subprocess.CompletedProcess[str]:
            argv = [*inside, "send", "--as", "worker", "--to", "lead@B", text]
            there = {**env, "CROSSINTERCOM_GATEWAY": via}
            return subprocess.run(argv, env=there, capture_output=True, text=True, check=False)

        sent = send(env["CROSSINTERCOM_GATEWAY"], "from the namespace")
        assert sent.returncode == 0, sent.stderr
        got = lead.next_message(30)
        assert got["message"] == "from the namespace" and got["from"]["host"] == "A", got

        wait = [*inside, "wait", "--as", "worker", "--format", "text", "--timeout", "60"]
        pipe = subprocess.PIPE
        quiet = subprocess.DEVNULL
        waiting = subprocess.Popen(wait, env=env, stdin=quiet, stdout=pipe, stderr=pipe, text=True)
        try:

            def held() -> bool:
                listed = sessions(a.home, quiet=True) or ()
                return any(s["name"] == "worker" and s["online"] for s in listed)

            wait_for(held, 30, "the namespace's waiter to hold worker on A")
            woke = b.cli_json("send", "--as", "lead", "--to", "worker@A", "wake up there")
            out, err = waiting.communicate(timeout=60)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate()
        assert "wake up there" in out and woke["id"] in out, (out, err)
        # From the namespace the gateway's address answers, loopback's services do not.
        refused = send(f"https://localhost:{gw.port}", "x")
        assert refused.returncode != 0, refused.stdout
    finally:
        gw.stop()
        cluster.close()
