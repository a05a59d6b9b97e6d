"""The relay's hot path on PostgreSQL (storage/pghot.py) against a real server: the sync
store's results and fences, and its error mapping when the server ends its connection idle,
mid-statement, or never answers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from crossintercom.errors import StoreFenced, StoreInDoubt, StoreUnavailable
from crossintercom.storage import Ack, LateReceipt, OutboundItem, open_store
from crossintercom.storage import engine as db
from crossintercom.storage.pghot import PgHotPath
from crossintercom.storage.postgres import PostgresStore
from crossintercom.storage.urls import parse_store_url

pytestmark = pytest.mark.pg
A, B = "alice@a", "bob@b"


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[PostgresStore]:
    store = open_store(pg_url, hot_path=True)
    assert isinstance(store, PostgresStore)
    yield store
    store.close()


@pytest.fixture
def admin(pg_url: str) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
        yield conn


def item(mid: str, size: int = 1, digest: str = "d" * 64) -> OutboundItem:
    return OutboundItem(mid, A, B, "s1", digest, {"id": mid}, size)


def hot(store: PostgresStore, body: Callable[[PgHotPath], Any]) -> Any:
    """Run ``body`` with a fresh hot path on a fresh event loop, closing it after."""

    async def main() -> Any:
        path = store.hot_path()
        try:
            return await body(path)
        finally:
            await path.aclose()

    return asyncio.run(main())


def wait_active(admin: psycopg.Connection[tuple[Any, ...]], pid: int) -> None:
    """Until backend ``pid`` runs a statement (blocked on a lock or a trigger)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row is not None and row[0] == "active":
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never ran its statement")


def test_same_results_and_fences_as_the_sync_store(pg_store: PostgresStore) -> None:
    ga, gb = pg_store.claim_host(A), pg_store.claim_host(B)
    big = pg_store.settings().max_message_bytes + 1

    async def body(path: PgHotPath) -> None:
        first = await path.enqueue([item("m1"), item("m2"), item("big", size=big)], generation=ga)
        assert [(r.state, r.inserted, r.code) for r in first] == [
            ("queued", True, None),
            ("queued", True, None),
            ("refused", False, "too_large"),
        ]
        again = await path.enqueue([item("m1"), item("m1", digest="e" * 64)], generation=ga)
        assert [(r.state, r.inserted, r.code) for r in again] == [
            ("queued", False, None),
            ("refused", False, "payload_conflict"),
        ]
        with pytest.raises(StoreFenced):
            await path.enqueue([item("stale")], generation=ga - 1)
        assert pg_store.get_message("stale") is None

        assert await path.fetch_inbound(B, gb - 1) == []  # fenced: nothing
        rows = await path.fetch_inbound(B, gb, session_ids=["s1"])
        assert rows == pg_store.fetch_inbound(B, gb, session_ids=["s1"])
        assert [(r.message_id, r.payload) for r in rows] == [
            ("m1", {"id": "m1"}),
            ("m2", {"id": "m2"}),
        ]
        assert await path.fetch_inbound(B, gb, session_ids=[]) == []

        assert await path.ack(B, gb - 1, [Ack("m1", "s1", "delivered")]) == 0
        acks = [Ack("m1", "s1", "delivered"), Ack("m1", "s1", "refused")]
        assert await path.ack(B, gb, acks) == 1
        assert await path.ack(B, gb, acks) == 0  # already finished
        assert pg_store.get_message("m1").states == {"s1": "delivered"}  # type: ignore[union-attr]

        [receipt] = await path.receipts(A, ga)
        assert (receipt.message_id, receipt.outcome) == ("m1", "delivered")
        assert await path.receipts(A, ga - 1) == []
        await path.consume_receipts(A, ga - 1, [receipt.id])  # fenced: kept
        assert await path.receipts(A, ga) == [receipt]
        await path.consume_receipts(A, ga, [receipt.id])
        assert await path.receipts(A, ga) == []

        late = [LateReceipt("m1", "s1", A, "planner", "shown")]
        assert await path.add_receipts(B, gb - 1, late) == 0
        assert await path.add_receipts(B, gb, late) == 1
        [shown] = pg_store.receipts(A, ga)
        assert (shown.outcome, shown.sender_session) == ("shown", "planner")

    hot(pg_store, body)


def test_connection_ended_while_idle_is_replaced_without_an_error(
    pg_store: PostgresStore, admin: psycopg.Connection[tuple[Any, ...]]
) -> None:
    ga, gb = pg_store.claim_host(A), pg_store.claim_host(B)

    async def body(path: PgHotPath) -> None:
        for round_ in range(3):
            await path.enqueue([item(f"before{round_}")], generation=ga)
            pid = path.backend_pid
            assert pid is not None
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
            # Not in doubt: the dead socket is noticed before anything is sent on it.
            [result] = await path.enqueue([item(f"after{round_}")], generation=ga)
            assert result.inserted
            assert path.backend_pid not in (None, pid)
        rows = await path.fetch_inbound(B, gb)
        assert len(rows) == 6
        assert await path.ack(B, gb, [Ack(r.message_id, "s1", "delivered") for r in rows]) == 6

    hot(pg_store, body)


def test_statements_lost_mid_run_are_retried_and_nothing_is_lost_or_doubled(
    pg_store: PostgresStore, admin: psycopg.Connection[tuple[Any, ...]], pg_url: str
) -> None:
    ga, gb = pg_store.claim_host(A), pg_store.claim_host(B)
    pg_store.enqueue([item("m1"), item("m2")], generation=ga)

    async def body(path: PgHotPath) -> None:
        await path.receipts(A, ga)  # connected
        pid = path.backend_pid
        assert pid is not None
        with psycopg.connect(pg_url.replace("+psycopg", "")) as locker:
            # The ack's UPDATE waits on this row lock; its connection is ended while it waits.
            locker.execute("SELECT 1 FROM deliveries WHERE message_id = 'm1' FOR UPDATE")
            acking = asyncio.ensure_future(
                path.ack(B, gb, [Ack("m1", "s1", "delivered"), Ack("m2", "s1", "delivered")])
            )
            await asyncio.to_thread(wait_active, admin, pid)
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
            # Retried on a new connection, which waits on the lock in turn.
            await asyncio.to_thread(_wait_new_backend, admin, path, pid)
            locker.rollback()
        assert await acking == 2
        assert sorted(r.message_id for r in await path.receipts(A, ga)) == ["m1", "m2"]
        assert await path.fetch_inbound(B, gb) == []

    hot(pg_store, body)


def _wait_new_backend(
    admin: psycopg.Connection[tuple[Any, ...]], path: PgHotPath, old: int
) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pid = path.backend_pid
        if pid is not None and pid != old:
            wait_active(admin, pid)
            return
        time.sleep(0.02)
    raise AssertionError("the statement was not retried on a new connection")


def test_enqueue_lost_after_sending_is_in_doubt(
    pg_store: PostgresStore, admin: psycopg.Connection[tuple[Any, ...]]
) -> None:
    ga = pg_store.claim_host(A)
    # A trigger holds the enqueue inside its statement; the backend is ended meanwhile, so the
    # client sees its connection die after the statement (its own commit) was sent.
    admin.execute(
        """
        CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_sleep(5); RETURN NULL; END $$;
        CREATE TRIGGER slow_insert AFTER INSERT ON messages
            FOR EACH ROW EXECUTE FUNCTION slow_insert();
        """
    )

    async def body(path: PgHotPath) -> None:
        await path.receipts(A, ga)  # connected
        pid = path.backend_pid
        assert pid is not None
        sending = asyncio.ensure_future(path.enqueue([item("doubt")], generation=ga))
        await asyncio.to_thread(wait_active, admin, pid)
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        with pytest.raises(StoreInDoubt, match="read it back by id"):
            await sending
        admin.execute("DROP TRIGGER slow_insert ON messages")
        # Ended before its commit: nothing landed, and enqueueing again settles it.
        assert pg_store.get_message("doubt") is None
        [result] = await path.enqueue([item("doubt")], generation=ga)
        assert result.inserted

    hot(pg_store, body)


def test_a_statement_past_the_deadline_has_its_connection_cut(
    pg_store: PostgresStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ga, gb = pg_store.claim_host(A), pg_store.claim_host(B)
    monkeypatch.setattr(db, "PG_OPERATION_DEADLINE_S", 0.3)

    async def body(path: PgHotPath) -> None:
        with psycopg.connect(pg_url.replace("+psycopg", "")) as locker:
            locker.execute("LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE")
            pids = set()
            with pytest.raises(StoreUnavailable):
                # Every attempt waits on the lock past the deadline and is cut.
                pids.add(path.backend_pid)
                await path.fetch_inbound(B, gb)
            locker.rollback()
        assert await path.fetch_inbound(B, gb) == []
        assert path.backend_pid not in pids

    hot(pg_store, body)


def test_errors_name_the_store_without_its_password() -> None:
    parsed = parse_store_url("postgresql://postgres:s3cret-pw@127.0.0.1:9/nowhere")
    store = PostgresStore(parsed)  # nothing connects until it is used
    try:
        with pytest.raises(StoreUnavailable) as caught:
            hot(store, lambda path: path.fetch_inbound(B, 1))
    finally:
        store.close()
    assert "s3cret-pw" not in caught.value.message
    assert "***" in caught.value.message


def test_relay_store_keeps_one_pooled_connection(
    pg_store: PostgresStore, admin: psycopg.Connection[tuple[Any, ...]], pg_url: str
) -> None:
    ga = pg_store.claim_host(A)
    threads = [threading.Thread(target=pg_store.hosts) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def body(path: PgHotPath) -> int:
        await path.enqueue([item("c")], generation=ga)
        with pg_store.waiter(B):
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (pg_url.rsplit("/", 1)[1],),
            ).fetchone()
        assert row is not None
        return int(row[0])

    assert hot(pg_store, body) == 3  # the pool's one, the hot path's, the listener's
