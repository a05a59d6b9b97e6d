"""PostgreSQL specifics: index use, the listener's recovery, commits lost in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import text

from crossintercom.errors import StoreInDoubt
from crossintercom.storage import Ack, OutboundItem, open_store
from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage.blocking import run
from crossintercom.storage.pgdriver import PgDriver
from crossintercom.storage.sqlstore import SqlStore
from crossintercom.storage.wakeup import PostgresWaiter

pytestmark = pytest.mark.pg
HOST = "bob@b"


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[SqlStore[PgDriver]]:
    store = run(open_store(pg_url))
    assert isinstance(store, SqlStore) and isinstance(store.driver, PgDriver)
    yield store
    run(store.aclose())


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def item(mid: str, host: str = HOST) -> OutboundItem:
    return OutboundItem(mid, "alice@a", host, "s1", "d" * 64, {"id": mid}, 1)


def test_hot_queries_use_indexes(pg_store: SqlStore[PgDriver]) -> None:
    run(pg_store.enqueue([item(f"m{i}", f"h{i % 20}") for i in range(400)]))
    statements = {
        "fetch_inbound": (
            q.inbound(by_session=False),
            {"host_id": HOST, "generation": 1, "limit": 500, "max_payload": 1 << 20},
        ),
        "fetch_inbound, by session": (
            q.inbound(by_session=True, array=True),
            {
                "host_id": HOST,
                "generation": 1,
                "limit": 500,
                "max_payload": 1 << 20,
                "session_ids": ["s1"],
            },
        ),
        "receipts": (q.LIST_RECEIPTS, {"host_id": HOST, "generation": 1, "limit": 500}),
        "expire": (q.EXPIRE_BATCH, {"now": q_now(), "finished": q_now(), "limit": 1000}),
    }
    engine = db.postgres_engine(pg_store.parsed)
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        # Tiny tables make a seq scan cheapest; forbid it to prove the index is usable.
        conn.execute(text("SET enable_seqscan = off"))
        for name, (stmt, params) in statements.items():
            compiled = stmt.compile(dialect=conn.dialect)
            explain = conn.exec_driver_sql(
                f"EXPLAIN {compiled.string}", compiled.construct_params(params)
            )
            plan = "\n".join(explain.scalars())
            assert "Index" in plan, f"{name} does not use an index:\n{plan}"
            assert "Seq Scan on deliveries" not in plan, f"{name}:\n{plan}"
            assert "Seq Scan on receipts" not in plan, f"{name}:\n{plan}"
        conn.rollback()
    engine.dispose()


def q_now() -> object:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def test_at_most_three_connections_per_store(pg_store: SqlStore[PgDriver], pg_url: str) -> None:
    dbname = pg_url.rsplit("/", 1)[1]
    with pg_store.waiter(HOST) as waiter:
        threads = [
            threading.Thread(target=run, args=(pg_store.enqueue([item(f"c{i}")]),))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert waiter.wait(1)
        with psycopg.connect(libpq(pg_url), autocommit=True) as admin:
            count = admin.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            ).fetchone()
        assert count is not None and count[0] <= 3


def test_listener_recovers_after_terminate_and_catches_up(
    pg_store: SqlStore[PgDriver], pg_url: str
) -> None:
    gen = run(pg_store.claim_host(HOST))
    with pg_store.waiter(HOST) as waiter:
        assert isinstance(waiter, PostgresWaiter)
        assert waiter.wait(1) is True  # catch-up on connect
        pid = waiter.backend_pid
        with psycopg.connect(libpq(pg_url), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # Inserted while the listener is down: its NOTIFY goes nowhere.
        run(pg_store.enqueue([item("while-down")]))
        start = time.monotonic()
        assert waiter.wait(5) is True  # reconnected: reports a wake-up for the catch-up query
        assert time.monotonic() - start < 5
        assert waiter.reconnects == 1 and waiter.backend_pid != pid
        assert [r.message_id for r in run(pg_store.fetch_inbound(HOST, gen))] == ["while-down"]
        # And it keeps working as a listener afterwards.
        run(pg_store.enqueue([item("after")]))
        assert waiter.wait(5) is True


def test_commit_lost_in_flight_is_resolved_by_id(pg_store: SqlStore[PgDriver], pg_url: str) -> None:
    # A deferred trigger runs inside COMMIT (the enqueue's one statement in autocommit is its
    # own); while it sleeps, the backend is terminated, so the client sees its connection die
    # after the write was sent.
    with psycopg.connect(libpq(pg_url), autocommit=True) as admin:
        admin.execute(
            """
            CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep(5); RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON messages
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
            """
        )
        outcome: list[BaseException | None] = []

        def send() -> None:
            try:
                run(pg_store.enqueue([item("in-doubt")]))
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 10
        victim = None
        while victim is None and time.monotonic() < deadline:
            row = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND state = 'active'"
                " AND datname = current_database()"  # other tests commit in parallel
            ).fetchone()
            victim = row[0] if row else None
            time.sleep(0.05)
        assert victim is not None, "COMMIT never started"
        admin.execute("SELECT pg_terminate_backend(%s)", (victim,))
        sender.join(15)
        admin.execute("DROP TRIGGER slow_commit ON messages")

    [exc] = outcome
    assert isinstance(exc, StoreInDoubt), exc
    assert "read it back by id" in exc.message
    # The caller resolves by id after reconnecting: here the commit did not land, so it is
    # safe to enqueue again, and that now succeeds.
    assert run(pg_store.get_message("in-doubt")) is None
    [result] = run(pg_store.enqueue([item("in-doubt")]))
    assert result.inserted
    assert run(pg_store.get_message("in-doubt")).states == {"s1": "queued"}  # type: ignore[union-attr]


def test_stale_pooled_connections_are_discarded_and_retried(
    pg_store: SqlStore[PgDriver], pg_url: str
) -> None:
    gen = run(pg_store.claim_host(HOST))
    # Two connections in the pool, both idle.
    threads = [
        threading.Thread(target=run, args=(pg_store.enqueue([item(f"warm{i}")]),)) for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dbname = pg_url.rsplit("/", 1)[1]
    for _round in range(2):
        with psycopg.connect(libpq(pg_url), autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            ).fetchall()
        assert killed
        # No pre-ping: each call meets a dead pooled socket first, and must not surface it.
        assert run(pg_store.heartbeat(HOST, gen)) is True
        [result] = run(pg_store.enqueue([item(f"after{_round}")]))
        assert result.inserted
        assert run(pg_store.ack(HOST, gen, [Ack(f"after{_round}", "s1", "delivered")])) == 1
        assert run(pg_store.receipts("alice@a", 1)) == []  # alice never claimed: fenced, no error
