"""PostgreSQL's driver (storage/pgdriver.py) against a real server: a pooled connection the
server ended while idle, a statement whose connection is ended while it runs, a server that
never answers (cut by the operation deadline), and errors that name the store without its
password. A commit lost in flight is test_postgres.py's."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from crossintercom.errors import StoreUnavailable
from crossintercom.storage import Ack, OutboundItem
from crossintercom.storage.blocking import run
from crossintercom.storage.pgdriver import PgDriver
from crossintercom.storage.postgres import postgres_store
from crossintercom.storage.sqlstore import SqlStore
from crossintercom.storage.urls import parse_store_url

pytestmark = pytest.mark.pg
A, B = "alice@a", "bob@b"
Admin = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[SqlStore[PgDriver]]:
    """A store of one pooled connection, so its server process is the one to end."""
    store = postgres_store(parse_store_url(pg_url), pool_size=1)
    run(store.check_schema())
    yield store
    run(store.aclose())


@pytest.fixture
def admin(pg_url: str) -> Iterator[Admin]:
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
        yield conn


def item(mid: str) -> OutboundItem:
    return OutboundItem(mid, A, B, "s1", "d" * 64, {"id": mid}, 1)


def backend_pid(store: SqlStore[PgDriver]) -> int:
    return int(
        run(store.driver.run(lambda c: c.execute(text("SELECT pg_backend_pid()")).scalar_one()))
    )


def waiting_backend(admin: Admin, wait_event_type: str, other_than: int | None = None) -> int:
    """Until a backend of this database waits on ``wait_event_type`` (a lock, a sleep)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'active' AND wait_event_type = %s AND pid <> %s",
            (wait_event_type, other_than or 0),
        ).fetchone()
        if row is not None:
            return int(row[0])
        time.sleep(0.02)
    raise AssertionError(f"no backend ever waited on {wait_event_type}")


def test_connection_ended_while_idle_is_replaced_without_an_error(
    pg_store: SqlStore[PgDriver], admin: Admin
) -> None:
    ga, gb = run(pg_store.claim_host(A)), run(pg_store.claim_host(B))
    for round_ in range(3):
        run(pg_store.enqueue([item(f"before{round_}")], generation=ga))
        pid = backend_pid(pg_store)
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        # Not in doubt: the dead socket is noticed before anything is sent on it.
        [result] = run(pg_store.enqueue([item(f"after{round_}")], generation=ga))
        assert result.inserted
        assert backend_pid(pg_store) != pid
    rows = run(pg_store.fetch_inbound(B, gb))
    assert len(rows) == 6
    acks = [Ack(r.message_id, "s1", "delivered") for r in rows]
    assert run(pg_store.ack(B, gb, acks)) == 6


def test_statements_lost_mid_run_are_retried_and_nothing_is_lost_or_doubled(
    pg_store: SqlStore[PgDriver], admin: Admin, pg_url: str
) -> None:
    ga, gb = run(pg_store.claim_host(A)), run(pg_store.claim_host(B))
    run(pg_store.enqueue([item("m1"), item("m2")], generation=ga))
    acked: list[int] = []
    acks = [Ack("m1", "s1", "delivered"), Ack("m2", "s1", "delivered")]
    with psycopg.connect(pg_url.replace("+psycopg", "")) as locker:
        # The ack's UPDATE waits on this row lock; its connection is ended while it waits.
        locker.execute("SELECT 1 FROM deliveries WHERE message_id = 'm1' FOR UPDATE")
        acking = threading.Thread(target=lambda: acked.append(run(pg_store.ack(B, gb, acks))))
        acking.start()
        pid = waiting_backend(admin, "Lock")
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        # Retried on a new connection, which waits on the lock in turn.
        waiting_backend(admin, "Lock", other_than=pid)
        locker.rollback()
        acking.join(30)
    assert acked == [2]
    assert sorted(r.message_id for r in run(pg_store.receipts(A, ga))) == ["m1", "m2"]
    assert run(pg_store.fetch_inbound(B, gb)) == []


def test_a_server_that_never_answers_is_cut_at_the_deadline(
    pg_store: SqlStore[PgDriver], pg_url: str
) -> None:
    gb = run(pg_store.claim_host(B))
    pg_store.driver.deadline_s = 0.3
    with psycopg.connect(pg_url.replace("+psycopg", "")) as locker:
        # No answer and no error: every attempt waits on the lock past the deadline, is cut.
        locker.execute("LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE")
        pid = backend_pid(pg_store)
        with pytest.raises(StoreUnavailable):
            run(pg_store.fetch_inbound(B, gb))
        locker.rollback()
    assert run(pg_store.fetch_inbound(B, gb)) == []
    assert backend_pid(pg_store) != pid  # the cut connection was not given back to the pool


def test_a_loop_blocked_by_the_process_is_not_blamed_on_the_store(
    pg_store: SqlStore[PgDriver], caplog: pytest.LogCaptureFixture
) -> None:
    """An operation whose body holds the event loop past the deadline (CPU work on the loop):
    the store answered all along, so its connection is not cut and the log names the loop."""
    pg_store.driver.deadline_s = 0.3

    def busy(conn: Any) -> int:
        value = int(conn.execute(text("SELECT 7")).scalar_one())
        time.sleep(1.6)  # holds the loop: the body runs on it (a greenlet)
        return value

    assert run(pg_store.run(busy)) == 7
    said = [r.getMessage() for r in caplog.records]
    assert any("event loop was blocked for over" in m for m in said), said
    assert not any("did not answer" in m for m in said), said


def test_errors_name_the_store_without_its_password() -> None:
    parsed = parse_store_url("postgresql://postgres:s3cret-pw@127.0.0.1:9/nowhere")
    store = postgres_store(parsed)  # nothing connects until it is used
    try:
        with pytest.raises(StoreUnavailable) as caught:
            run(store.fetch_inbound(B, 1))
    finally:
        run(store.aclose())
    assert "s3cret-pw" not in caught.value.message
    assert "***" in caught.value.message
