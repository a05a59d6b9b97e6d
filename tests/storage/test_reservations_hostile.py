"""Reservation rows another writer of the store left, read by every host: a time that is none
(SQLite text, PostgreSQL 'infinity' or the year 9999), a megabyte reason, a glob that is not
UTF-8, a host's thousands of rows; each left out alone and logged, the reads bounded, and
the rest of the project's reservations listed and reservable as before (docs/operations.md,
"Trust model"). And the quotas of a session and a host, and a renewal that deletes only its
own host's row."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, text

from crossintercom.errors import QuotaExceeded, StoreError
from crossintercom.models import SessionInfo
from crossintercom.reservations import Quotas
from crossintercom.storage import MailboxStore, open_store
from crossintercom.storage.blocking import run
from crossintercom.storage.sqlstore import SqlStore
from tests.storage.test_host_roles_attack import Host, hosts  # noqa: F401  (a fixture)

P = "git.example.org/team/app"


def _setup(store: MailboxStore) -> tuple[int, int]:
    g1, g2 = run(store.claim_host("h1")), run(store.claim_host("h2"))
    run(store.publish_sessions("h1", g1, [SessionInfo(id="a", host="h1", name="alice")]))
    run(store.publish_sessions("h2", g2, [SessionInfo(id="b", host="h2", name="bob")]))
    return g1, g2


def _reserve(store: MailboxStore, host: str, gen: int, session: str, *globs: str, **kw: Any) -> Any:
    args: dict[str, Any] = {"mode": "exclusive", "ttl_s": 600, "reason": None, **kw}
    return run(store.reserve(host, gen, project=P, session_id=session, globs=list(globs), **args))


def _plant_sqlite(path: Path, gen: int) -> None:
    """Rows as a writer of the file may leave them, each next to what a relay writes: the
    time text compares inside the live window, so only reading it can tell."""
    soon = datetime.now(UTC) + timedelta(days=1)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    fine = soon.strftime("%Y-%m-%d %H:%M:%S.%f")
    bad: list[tuple[str, object, object, object, object]] = [
        ("no-time", "x/**", None, now, soon.strftime("%Y-%m-%d") + " not a time"),
        ("big-reason", "y/**", "r" * (9 << 20), now, fine),
        ("not-utf8", b"\xff\xfe/**", None, now, fine),
        ("created-blob", "z/**", None, b"\x00\x01", fine),
    ]
    with sqlite3.connect(path) as db:
        for rid, glob, reason, created, expires in bad:
            db.execute(
                "INSERT INTO reservations (id, project, glob, mode, host_id, session_id, "
                "generation, reason, created, expires_at) VALUES (?, ?, ?, 'exclusive', 'h1', "
                "'a', ?, ?, ?, ?)",
                (rid, P, glob, gen, reason, created, expires),
            )


def test_unreadable_sqlite_rows_are_left_out_alone(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = run(open_store(sqlite_url))
    try:
        g1, g2 = _setup(store)
        _reserve(store, "h1", g1, "a", "src/**", reason="refactor")
        _plant_sqlite(Path(sqlite_url.removeprefix("sqlite:///")), g1)
        # every read lists the good row, on either side of the bad ones
        assert [h.glob for h in run(store.reservations(P))] == ["src/**"]
        assert [h.glob for h in run(store.reservations())] == ["src/**"]
        clash = _reserve(store, "h2", g2, "b", "src/x.py", "docs/**")
        assert [h.glob for h in clash.conflicts] == ["src/**"]
        made = _reserve(store, "h2", g2, "b", "docs/**")
        assert made.conflicts == [] and [h.glob for h in made.held] == ["docs/**"]
    finally:
        run(store.aclose())
    (logged,) = {r.getMessage() for r in caplog.records if "rows left out" in r.getMessage()}
    assert "reservation rows left out" in logged


def test_any_failure_in_a_body_ends_its_transaction(sqlite_url: str) -> None:
    """A body that fails with an error no driver raises (a value its type cannot read) while
    its cursor is open: the caller gets a store error and the file's lock is free at once."""
    store = run(open_store(sqlite_url))
    path = Path(sqlite_url.removeprefix("sqlite:///"))

    def fail(conn: Connection) -> None:
        conn.execute(text("INSERT INTO settings (id) SELECT 99 WHERE 0"))
        rows = conn.execute(text("SELECT 1 UNION ALL SELECT 2"))
        next(iter(rows))
        raise ValueError("Invalid isoformat string: 'not a time'")

    assert isinstance(store, SqlStore)
    try:
        with pytest.raises(StoreError, match="ValueError"):
            run(store.run(fail))
        with sqlite3.connect(path, timeout=0) as db:  # no wait: the lock is free now
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE hosts SET generation = generation WHERE 0")
    finally:
        run(store.aclose())


def test_a_renewal_deletes_only_its_own_hosts_row(store: MailboxStore) -> None:
    """A session registered on h2 with the id of h1's session, reserving h1's glob: h1's row
    stays (the delete names its host), and the two are two sessions that clash."""
    g1, g2 = _setup(store)
    _reserve(store, "h1", g1, "a", "src/**")
    twin = _reserve(store, "h2", g2, "a", "src/**")
    assert [(h.host, h.session) for h in twin.conflicts] == [("h1", "a")]
    assert [(h.host, h.glob) for h in run(store.reservations(P))] == [("h1", "src/**")]


def test_quotas_of_a_session_and_a_host(store: MailboxStore) -> None:
    g1, _ = _setup(store)
    run(store.publish_sessions("h1", g1, [SessionInfo(id=s, host="h1") for s in ("a", "a2")]))
    small = Quotas(per_session=3, per_session_chars=40, per_host=5, per_host_chars=1000)
    assert _reserve(store, "h1", g1, "a", "a1", "a2", "a3", quotas=small).conflicts == []
    # renewing what the session holds is no new reservation
    assert len(_reserve(store, "h1", g1, "a", "a1", "a2", "a3", quotas=small).held) == 3
    with pytest.raises(QuotaExceeded, match="this session would hold 4"):
        _reserve(store, "h1", g1, "a", "a4", quotas=small)
    with pytest.raises(QuotaExceeded, match="characters"):
        _reserve(store, "h1", g1, "a2", "b1", reason="r" * 40, quotas=small)
    assert _reserve(store, "h1", g1, "a2", "b1", "b2", quotas=small).conflicts == []
    with pytest.raises(QuotaExceeded, match="this host would hold 6"):
        _reserve(store, "h1", g1, "a2", "b3", quotas=small)
    # refused all or none: nothing of the refused reserves was written
    assert len(run(store.reservations(P))) == 5


def test_a_host_flooding_rows_is_read_bounded(sqlite_url: str) -> None:
    store = run(open_store(sqlite_url))
    try:
        g1, g2 = _setup(store)
        _reserve(store, "h2", g2, "b", "src/**")
        now = datetime.now(UTC)
        with sqlite3.connect(Path(sqlite_url.removeprefix("sqlite:///"))) as db:
            db.executemany(
                "INSERT INTO reservations (id, project, glob, mode, host_id, session_id, "
                "generation, created, expires_at) VALUES (?, ?, ?, 'shared', 'h1', 'a', ?, ?, ?)",
                [
                    (f"f{i}", P, f"flood/{i}", g1, str(now), str(now + timedelta(days=1)))
                    for i in range(3000)
                ],
            )
        found, more = run(store.reservation_page(P, per_host=100, limit=50))
        assert len(found) == 50 and more
        found, more = run(store.reservation_page(P, per_host=100, limit=500))
        assert len(found) == 101 and not more  # h1's first 100, and h2's
        assert ("h2", "src/**") in [(h.host, h.glob) for h in found]
    finally:
        run(store.aclose())


@pytest.mark.pg
def test_a_host_role_s_endless_times_and_floods_break_no_one_s_reads(
    hosts: dict[str, Host],  # noqa: F811
) -> None:
    """A host role stores its own rows lapsing at 'infinity', in the year 9999, made at
    'infinity', with a 9 MiB reason, and 1,500 more: every other host still lists, reserves
    and checks conflicts, reading each host's first rows only."""
    a, b = hosts["A"], hosts["B"]
    run(a.store.publish_sessions(a.host, a.gen, [SessionInfo(id="sa", host=a.host)]))
    run(b.store.publish_sessions(b.host, b.gen, [SessionInfo(id="sb", host=b.host)]))
    kw: dict[str, Any] = {"project": P, "mode": "exclusive", "ttl_s": 600, "reason": None}
    run(b.store.reserve(b.host, b.gen, session_id="sb", globs=["src/**"], **kw))
    insert = (
        "INSERT INTO public.reservations (id, project, glob, mode, host_id, session_id, "
        "generation, reason, created, expires_at) VALUES (%s, %s, %s, 'exclusive', %s, 'sa', "
        "%s, %s, {created}, {expires})"
    )
    with a.connect() as conn:
        for rid, created, expires, reason in (
            ("inf", "now()", "'infinity'", None),
            ("neg", "now()", "'-infinity'", None),
            ("y9999", "now()", "'9999-12-31 23:59:59+00'", None),
            ("made-inf", "'infinity'", "now() + interval '1 day'", None),
            ("big", "now()", "now() + interval '1 day'", "r" * (9 << 20)),
        ):
            conn.execute(
                insert.format(created=created, expires=expires),
                (rid, P, f"{rid}/**", a.host, a.gen, reason),
            )
        conn.execute(
            "INSERT INTO public.reservations (id, project, glob, mode, host_id, session_id, "
            "generation, created, expires_at) SELECT 'f' || i, %s, 'flood/' || i, 'shared', "
            "%s, 'sa', %s, now(), now() + interval '1 day' FROM generate_series(1, 1500) i",
            (P, a.host, a.gen),
        )
    for reader in (a, b):
        found = run(reader.store.reservations(P))
        globs = {h.glob for h in found}
        assert "src/**" in globs and not globs & {"inf/**", "y9999/**", "made-inf/**", "big/**"}
        assert sum(h.host == a.host for h in found) <= 1000
        assert run(reader.store.reservations()) == found
    made = run(b.store.reserve(b.host, b.gen, session_id="sb", globs=["inf/x", "y9999/x"], **kw))
    assert made is not None and made.conflicts == []  # rows no one reads stand in no one's way
    assert {h.glob for h in made.held} == {"src/**", "inf/x", "y9999/x"}


@pytest.mark.pg
def test_a_long_conflict_check_leaves_the_loop_free(pg_url: str) -> None:
    """A reserve whose conflict check has much to compare (50 globs against 300 of another
    host's): on PostgreSQL the operation's body runs on the relay's event loop, so the
    comparison goes to a thread and the loop (the heartbeat's) keeps turning meanwhile."""
    store = run(open_store(pg_url))
    try:
        g1, g2 = _setup(store)
        # pairs that share their lead ("src/lib/") and never overlap: each compared in full
        rows = [f"src/lib/d{i}/*.pq" for i in range(300)]
        kw: dict[str, Any] = {"project": P, "mode": "shared", "ttl_s": 600, "reason": None}
        sessions = [SessionInfo(id=f"s{i}", host="h1") for i in range(2)]
        run(store.publish_sessions("h1", g1, sessions))
        for i in range(2):
            run(store.reserve("h1", g1, session_id=f"s{i}", globs=rows[i * 150 :][:150], **kw))
        mine = [f"src/lib/*/e{j}/*.py" for j in range(50)]

        async def timed() -> tuple[float, float]:
            loop = asyncio.get_running_loop()
            gaps, last, done = [0.0], loop.time(), asyncio.Event()

            async def tick() -> None:
                nonlocal last
                while not done.is_set():
                    await asyncio.sleep(0.01)
                    gaps.append(loop.time() - last)
                    last = loop.time()

            ticker = asyncio.ensure_future(tick())
            started = loop.time()
            await store.reserve("h2", g2, session_id="b", globs=mine, **{**kw, "mode": "exclusive"})
            took = loop.time() - started
            done.set()
            await ticker
            return took, max(gaps)

        took, gap = run(timed())
    finally:
        run(store.aclose())
    assert took > 0.5, f"the check took {took:.2f} s: too little to tell"
    assert gap < took / 3, f"the loop stood still {gap:.2f} s of the reserve's {took:.2f} s"
