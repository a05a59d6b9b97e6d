"""A relay holds at most three PostgreSQL connections: its pool's two and the
listener's, the archive (off) none (docs/storage.md); counted by the server for each relay's
own sockets."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from tests.relay.conftest import Cluster, wait_for

pytestmark = pytest.mark.pg


def tcp_ports(pid: int) -> set[int]:
    """The local TCP ports of process ``pid``'s sockets."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_each_relay_holds_at_most_three_connections(pg_url: str) -> None:
    with Cluster(pg_url) as cluster:
        a, b = cluster.up("A", "B")
        worker = b.listen("worker")
        a.wait_sees("worker", "B")
        planner = a.client("planner")
        for i in range(20):
            assert planner.send("worker@B", f"m{i}").outcome.value == "delivered"
        wait_for(lambda: len(worker.message_ids()) == 20, 30, "every message printed")
        dbname = pg_url.rsplit("/", 1)[1]
        with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as admin:
            rows = admin.execute(
                "SELECT client_port, query FROM pg_stat_activity WHERE datname = %s",
                (dbname,),
            ).fetchall()
        ports = [int(port) for (port, _q) in rows if port is not None]
        for host in (a, b):
            assert host.relay is not None
            held = len(tcp_ports(host.relay.pid) & set(ports))
            assert 1 <= held <= 3, (host.host_id, held, sorted(q[:60] for _p, q in rows))
