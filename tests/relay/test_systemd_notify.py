"""The relay speaks systemd's notify protocol (relay/systemd.py) to a NOTIFY_SOCKET the test
binds, as systemd would for a ``Type=notify`` unit with ``WatchdogSec=``: READY=1 only once the
store is reached, WATCHDOG=1 pings from its event loop that stop when the loop blocks, STATUS=
lines, and STOPPING=1 on SIGTERM."""

from __future__ import annotations

import signal
import socket
import uuid
from collections.abc import Iterator

import pytest

from crossintercom.testhooks import FAULTS_ENV
from tests.relay.conftest import Cluster, Host, wait_for
from tests.relay.metricskit import free_port

# 0.2 s: pings every 0.1 s.
WATCHDOG_USEC = "200000"


class NotifySocket:
    """A datagram socket in the abstract namespace, as systemd names them with a leading '@'."""

    def __init__(self) -> None:
        self.name = f"@crossintercom-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + self.name[1:].encode())
        self.got: list[str] = []

    def drain(self, timeout: float = 0.0) -> list[str]:
        """The fields received (one datagram may carry several lines), waiting at most
        ``timeout`` for the first."""
        new: list[str] = []
        if timeout > 0:
            self.sock.settimeout(timeout)
        else:
            self.sock.setblocking(False)
        while True:
            try:
                data = self.sock.recv(4096)
            except (BlockingIOError, TimeoutError):
                break
            new += data.decode().splitlines()
            self.sock.setblocking(False)
        self.got += new
        return new

    def wait_field(self, field: str, timeout: float = 30) -> None:
        wait_for(
            lambda: field in self.got or field in self.drain(0.1),
            timeout,
            lambda: f"{field} among {self.got[-20:]}",
        )

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    try:
        yield sock
    finally:
        sock.close()


def _relay(cluster: Cluster, host_id: str, notify: NotifySocket, **env: str) -> Host:
    host = cluster.host(host_id, relay=False)
    host.env |= {"NOTIFY_SOCKET": notify.name, "WATCHDOG_USEC": WATCHDOG_USEC, **env}
    host.start_relay(wait=False)
    return host


def test_ready_after_the_store_then_stopping_on_sigterm(
    sqlite_cluster: Cluster, notify: NotifySocket
) -> None:
    host = _relay(sqlite_cluster, "A", notify)
    notify.wait_field("READY=1")
    before_ready = notify.got[: notify.got.index("READY=1")]
    assert "WATCHDOG=1" in notify.got or "WATCHDOG=1" in notify.drain(5)
    # The host row was claimed (store reached, schema checked) and the broker link is up.
    assert host.relay_connected()
    statuses = [f for f in notify.got if f.startswith("STATUS=")]
    assert any(s.startswith("STATUS=ready: host A, generation 1") for s in statuses), statuses
    assert "STOPPING=1" not in before_ready
    assert host.relay is not None
    host.relay.send_signal(signal.SIGTERM)
    assert host.relay.wait(30) == 0, host.relay_log()
    notify.drain()
    assert "STOPPING=1" in notify.got
    assert notify.got.index("STOPPING=1") > notify.got.index("READY=1")


def test_no_ready_while_the_store_is_unreachable(
    sqlite_cluster: Cluster, notify: NotifySocket
) -> None:
    # Nothing listens on this port: the relay keeps trying, and says so, but is not ready.
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/nothing"
    host = _relay(sqlite_cluster, "A", notify, CROSSINTERCOM_STORE=url)
    wait_for(
        lambda: any(f.startswith("STATUS=waiting for the store") for f in notify.drain(0.1)),
        60,
        "a status line saying the relay waits for the store",
    )
    notify.wait_field("WATCHDOG=1")
    pings = notify.got.count("WATCHDOG=1")
    wait_for(
        lambda: notify.drain(0.1) is not None and notify.got.count("WATCHDOG=1") >= pings + 3,
        30,
        "more pings while the relay waits",
    )
    assert "READY=1" not in notify.got
    assert host.relay is not None and host.relay.poll() is None


def test_watchdog_pings_stop_when_the_loop_blocks(
    sqlite_cluster: Cluster, notify: NotifySocket
) -> None:
    host = _relay(sqlite_cluster, "A", notify, **{FAULTS_ENV: "block:relay_heartbeat"})
    assert host.relay is not None
    try:
        _pings_stop(host, notify)
    finally:
        host.relay.kill()  # a blocked loop handles no SIGTERM


def _pings_stop(host: Host, notify: NotifySocket) -> None:
    notify.wait_field("READY=1")
    wait_for(
        lambda: notify.drain() is not None and "blocking the thread" in host.relay_log(),
        60,
        lambda: f"the loop to block: {host.relay_log()[-2000:]}",
    )
    pings = notify.got.count("WATCHDOG=1")
    assert pings >= 2, notify.got
    notify.drain()  # whatever was sent before the loop blocked
    # Five ping intervals without a ping: systemd (WatchdogSec) would restart this relay.
    late = notify.drain(1.0)
    assert "WATCHDOG=1" not in late, late
    assert host.relay is not None and host.relay.poll() is None
