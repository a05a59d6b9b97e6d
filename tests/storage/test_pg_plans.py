"""Plans made on empty tables do not outlive the tables' growth (storage/plans.py).

The server keeps one generic plan per prepared statement; made while the store is empty, it
scans whole tables, and a server without autovacuum never replaces it. Each pooled store
connection drops its plans on a backing-off schedule (pgdriver.async_engine): after the tables
grow, the delivery path's statements look rows up by index again. Counted by the server:
``seq_scan`` of ``pg_stat_user_tables``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, cast

import psycopg
import pytest
from sqlalchemy import Connection, text

from crossintercom.storage import Ack, OutboundItem, open_store
from crossintercom.storage.blocking import run
from crossintercom.storage.engine import PLANS_KEY
from crossintercom.storage.pgdriver import PgDriver
from crossintercom.storage.plans import PlanRefresh
from crossintercom.storage.postgres import postgres_store
from crossintercom.storage.sqlstore import SqlStore
from crossintercom.storage.urls import parse_store_url
from tests.pgharness import PgServer, create_database, drop_database

pytestmark = pytest.mark.pg
A, B = "alice@a", "bob@b"
GROWN = 20_000  # finished rows of other hosts, added after the plans were made
TABLES = ("messages", "deliveries")
# Runs of the no-refresh control before it is called failed (see that test).
ATTEMPTS = 4
GROW = (
    "INSERT INTO messages (message_id, sender_host, digest, payload, size, created) "
    "SELECT 'old-' || g, 'carol@c', repeat('d', 64), '{}'::json, 2, now() "
    "FROM generate_series(1, :n) g",
    "INSERT INTO deliveries (message_id, recipient_host, recipient_session, state, "
    "finished_at, expires_at) SELECT 'old-' || g, 'dave@d', 's1', 'delivered', now(), now() "
    "FROM generate_series(1, :n) g",
)

Admin = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture
def admin(pg_url: str) -> Iterator[Admin]:
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
        yield conn


def _item(mid: str) -> OutboundItem:
    return OutboundItem(mid, A, B, "s1", "d" * 64, {"id": mid, "message": "x" * 100}, 130)


def _grow(conn: Connection) -> None:
    for stmt in GROW:
        conn.execute(text(stmt), {"n": GROWN})


def _counters(admin: Admin, inserted: int) -> dict[str, int]:
    """Sequential scans per table, once the server's statistics show ``inserted`` message
    rows (a backend reports its counts shortly after it goes idle: wait for that fact)."""
    deadline = time.monotonic() + 30
    while True:
        rows = admin.execute(
            "SELECT relname, seq_scan, n_tup_ins FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            (list(TABLES),),
        ).fetchall()
        found = {name: (scans, ins) for name, scans, ins in rows}
        if found.get("messages", (0, 0))[1] >= inserted:
            return {name: scans for name, (scans, _) in found.items()}
        if time.monotonic() > deadline:
            raise AssertionError(f"the statistics never showed {inserted} inserts: {found}")
        time.sleep(0.1)


class Cycles:
    """Messages A -> B, one at a time: enqueue, fetch, ack; ``sent`` counts them."""

    def __init__(self, store: SqlStore[PgDriver]) -> None:
        self.gens = (run(store.claim_host(A)), run(store.claim_host(B)))
        self.sent = 0

    def blocking(self, store: SqlStore[PgDriver], n: int) -> None:
        ga, gb = self.gens
        for _ in range(n):
            self.sent += 1
            mid = f"m{self.sent}"
            run(store.enqueue([_item(mid)], generation=ga))
            rows = run(store.fetch_inbound(B, gb, session_ids=["s1"]))
            assert [r.message_id for r in rows] == [mid]
            run(store.ack(B, gb, [Ack(mid, "s1", "delivered")]))


def _refreshes(store: SqlStore[PgDriver]) -> int:
    """Refreshes so far of the schedule of the pooled connection checked out now (checking
    one out is when its schedule is looked at)."""

    async def read() -> int:
        async with store.driver.engine.connect() as conn:
            schedule = conn.info.get(PLANS_KEY)
            return 0 if schedule is None else int(schedule.refreshes)

    return run(read())


def test_pooled_connections_plan_again_after_the_tables_grow(pg_url: str, admin: Admin) -> None:
    store = run(open_store(pg_url))
    assert isinstance(store, SqlStore) and isinstance(store.driver, PgDriver)
    cycles = Cycles(store)

    def send(n: int) -> None:
        cycles.blocking(store, n)

    try:
        send(30)  # prepared, and planned generically, on tables of a few pages
        run(store.driver.run(_grow))
        before = _refreshes(store)
        deadline = time.monotonic() + 30
        while _refreshes(store) == before and time.monotonic() < deadline:
            send(5)
        send(15)  # prepared again and planned generically on the grown tables
        start = _counters(admin, GROWN + cycles.sent)
        send(30)
        end = _counters(admin, GROWN + cycles.sent)
    finally:
        run(store.aclose())
    assert {t: end[t] - start[t] for t in TABLES} == {"messages": 0, "deliveries": 0}


def _never_refreshed(store: SqlStore[PgDriver]) -> None:
    """The store's one pooled connection with a schedule that never comes."""

    async def swap() -> None:
        async with store.driver.engine.connect() as conn:
            conn.info[PLANS_KEY] = PlanRefresh(after_s=1e9, after_statements=10**9)

    run(swap())


def _cached_plans(conn: Connection) -> str:
    """The plans the connection's prepared statements run now (their cached generic plans;
    the parameters do not choose them)."""
    prepared = conn.execute(text("SELECT name, parameter_types FROM pg_prepared_statements"))
    plans: list[str] = []
    for name, types in prepared.all():
        nulls = ", ".join("NULL" for _ in types)
        plans += conn.execute(text(f"EXPLAIN EXECUTE {name}({nulls})")).scalars()
    return "\n".join(plans)


def test_without_refreshes_a_plan_of_the_empty_store_keeps_scanning(
    pg_server: PgServer, pg_template: str
) -> None:
    """What the refreshes are for: with none, the delivery path's statements planned on the
    empty store still scan deliveries after they grew. Read from the plans themselves, on the
    connection that holds them, straight after the growth, which runs on that very connection.
    The server may still reset a backend's caches at any moment (other databases' DDL under
    load overflows its invalidation queue), which re-plans: a reset can only hide the stale
    plan, never show one, so the scenario runs again on a fresh database until it is seen."""
    plans: list[str] = []
    for _ in range(ATTEMPTS):
        name = create_database(pg_server, template=pg_template)
        try:
            plan = _stale_plan(pg_server.url_for(name))
        finally:
            drop_database(pg_server, name)
        if "Seq Scan on deliveries" in plan:
            return
        plans.append(plan)
    raise AssertionError("\n\n".join(plans))


def _stale_plan(url: str) -> str:
    """The enqueue's cached plan, made on the empty store, read after the tables grew."""
    store = postgres_store(parse_store_url(url), pool_size=1)
    try:
        _never_refreshed(store)
        cycles = Cycles(store)
        cycles.blocking(store, 30)  # prepared, and planned generically, on tables of a few pages
        run(store.driver.run(_grow))
        return run(store.driver.run(_cached_plans))
    finally:
        run(store.aclose())


def _prepared(conn: Connection) -> list[str]:
    return list(conn.execute(text("SELECT statement FROM pg_prepared_statements")).scalars())


def _prepare_threshold(conn: Connection) -> int | None:
    raw: Any = conn.connection.driver_connection
    return cast(int | None, raw.prepare_threshold)


def test_the_heartbeat_is_never_prepared_so_a_plan_refresh_costs_an_idle_relay_no_commit(
    pg_url: str,
) -> None:
    """psycopg prepares a statement after a few runs, in a round trip of its own: outside a
    transaction that is a commit of its own, one more for an idle relay after each plan
    refresh. The beat runs unprepared; the delivery path's statements still are prepared
    (the control: the check sees a prepared statement when there is one)."""
    store = postgres_store(parse_store_url(pg_url), pool_size=1)
    try:
        cycles = Cycles(store)
        for _ in range(12):
            assert run(store.beat(A, cycles.gens[0], ["s1"])) is not None
        cycles.blocking(store, 12)
        prepared = run(store.driver.run(_prepared))
        threshold = run(store.driver.run(_prepare_threshold))
    finally:
        run(store.aclose())
    assert not [s for s in prepared if "bumped" in s], prepared
    assert [s for s in prepared if "INSERT INTO messages" in s], prepared
    assert threshold == 5  # psycopg's default, back after each beat
