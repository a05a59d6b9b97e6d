"""A database session left idle inside a transaction on the store (PostgreSQL), holding locks:
`status` names it (pid, user, application, tables) while it lasts, and clears once it ends.
Locks that block nobody's heartbeat are named after 5 s idle; a lock the relay's own
heartbeat waits behind is named when the heartbeat stalls."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from crossintercom.storage.interface import MIGRATION_LOCK
from crossintercom.storage.queries import PG_MIGRATION_LOCK_KEY
from crossintercom.storage.urls import parse_store_url
from tests.relay.conftest import Cluster, Host, wait_for

pytestmark = pytest.mark.pg

HOLDER = "ci-stuck-holder"
# The relay looks every second, not every 15 s: the tests wait for the fact, sooner.
LOOK_EVERY_S = 1.0


def store_line(host: Host) -> str:
    line: str = host.cli_json("status")["relay"].get("store") or ""
    return line


@pytest.fixture
def holder(pg_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A connection of the test's own, as a careless client (or a frozen process) would hold
    one: a transaction opened and left idle."""
    conn = psycopg.connect(parse_store_url(pg_url).libpq_conninfo(), application_name=HOLDER)
    try:
        yield conn
    finally:
        conn.close()


def named(host: Host) -> bool:
    line = store_line(host)
    return "idle in a transaction" in line and HOLDER in line


def test_idle_transaction_holding_locks_is_named_in_status(
    pg_url: str, holder: psycopg.Connection[tuple[object, ...]]
) -> None:
    with Cluster(pg_url) as cluster:
        a = cluster.host("A", stuck_check_s=LOOK_EVERY_S)
        store = a.cli_json("status")["store"]
        # A row lock on the settings no relay writes: it blocks nobody's heartbeat.
        holder.execute("SELECT * FROM settings FOR SHARE").fetchall()
        wait_for(lambda: named(a), 60, "status to name the idle transaction")
        assert "settings" in store_line(a)
        assert HOLDER in a.relay_log()
        holder.rollback()
        wait_for(lambda: store_line(a) == store, 30, "the warning to clear")

        # The host's own row: its heartbeat waits behind the lock, and the stall names it.
        holder.execute("SELECT * FROM hosts WHERE host_id = 'A' FOR UPDATE").fetchall()
        wait_for(lambda: named(a), 30, "the stalled heartbeat to name what it waits behind")
        assert "hosts" in store_line(a)
        holder.rollback()
        wait_for(lambda: store_line(a) == store, 30, "the warning to clear")


def test_table_and_migration_locks_are_named_in_status(
    pg_url: str, holder: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A LOCK TABLE every host's writes wait behind, and the migration lock, held by another
    session: `status` and the relay's log name the holder (pid, user, application)."""
    with Cluster(pg_url) as cluster:
        a = cluster.host("A", stuck_check_s=LOOK_EVERY_S)
        store = a.cli_json("status")["store"]
        pid = holder.info.backend_pid

        def holding(what: str) -> bool:
            line = store_line(a)
            return f"pid {pid}" in line and HOLDER in line and f"holding {what}" in line

        # EXCLUSIVE on the settings: reads go on, so only the periodic look names it.
        holder.execute("LOCK TABLE settings IN EXCLUSIVE MODE")
        wait_for(lambda: holding("settings"), 60, "status to name the table lock")
        assert f"pid {pid}" in a.relay_log()
        holder.rollback()
        wait_for(lambda: store_line(a) == store, 30, "the warning to clear")

        holder.execute("SELECT pg_advisory_lock(%s)", (PG_MIGRATION_LOCK_KEY,))
        holder.commit()  # a session-level lock outlives its transaction
        wait_for(lambda: holding(MIGRATION_LOCK), 60, "status to name the migration lock")
        holder.execute("SELECT pg_advisory_unlock(%s)", (PG_MIGRATION_LOCK_KEY,))
        holder.commit()
        wait_for(lambda: store_line(a) == store, 30, "the warning to clear")
