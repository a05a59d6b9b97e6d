"""A host keeps to three database connections on PostgreSQL: the store's pool of one, the
relay's hot path and the LISTEN connection; the archive's own connection is closed while the
archive is off (docs/performance.md, "Idle"; tests/relay/test_pg_connections.py counts them
for each relay)."""

from __future__ import annotations

import psycopg
import pytest

from tests.relay.conftest import Cluster, wait_for

pytestmark = pytest.mark.pg

PER_HOST = 3


def _backends(conn: psycopg.Connection[tuple[int]]) -> int:
    """The store database's backends but this one (every other is a relay's: the database is
    this test's own)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_hosts_keep_to_three_database_connections(pg_url: str) -> None:
    with (
        Cluster(pg_url) as cluster,
        psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn,
    ):
        a, b = cluster.up("A", "B")
        b.listen("worker")
        a.wait_sees("worker", "B")
        limit = PER_HOST * 2
        # Each relay read the archive setting at start on the archive's connection, then
        # closed it (the archive is off).
        wait_for(lambda: _backends(conn) <= limit, 30, "the archive's connections to close")
        sender = a.client("boss")
        seen = []
        for i in range(20):
            assert sender.send("worker@B", f"busy {i}").outcome.value == "delivered"
            seen.append(_backends(conn))
        assert max(seen) <= limit, seen
        assert min(seen) >= 4, seen  # both relays' LISTEN and pooled connections are there
