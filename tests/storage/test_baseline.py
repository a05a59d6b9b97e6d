"""The baseline revision (0016, the schema written whole in storage/schema) equals what version
0.1.0's sixteen revisions built, compared normalised on PostgreSQL (pg_dump) and on SQLite
(sqlite_master); a store 0.1.0 left at 0016, holding mail, receipts, reservations and host
roles, goes through `db upgrade` with every row as it was and keeps working; a store at an
older revision of that chain is told what to do; and the policies take a code added since a
store was made without any revision."""

from __future__ import annotations

import re
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text

from crossintercom.errors import SchemaOutdated
from crossintercom.models import SessionInfo
from crossintercom.storage import Ack, LateReceipt, OutboundItem, migrate, open_store, schema
from crossintercom.storage.blocking import run
from crossintercom.storage.roles import grant_host
from crossintercom.storage.urls import parse_store_url
from tests.hostroles import drop_host_roles
from tests.pgharness import PgServer, create_database, drop_database
from tests.storage.old_migrations import old_upgrade

PASSWORD = "b4seline-r0le"
_ARRAY = re.compile(r"ARRAY\[([^\]]*)\]")


def _sorted_arrays(line: str) -> str:
    """``line`` with the members of each ARRAY[...] in sorted order: the order of a list a
    policy tests membership of means nothing (0.1.0 wrote the codes as they were added)."""
    return _ARRAY.sub(lambda m: "ARRAY[" + ", ".join(sorted(m.group(1).split(", "))) + "]", line)


def _pg_schema(url: str) -> list[str]:
    """pg_dump's schema of the database, less comments, settings and its session keys."""
    parsed = parse_store_url(url).url
    out = subprocess.run(
        ["pg_dump", "--schema-only", "--no-owner", "-h", str(parsed.host), "-p",
         str(parsed.port or 5432), "-U", str(parsed.username), str(parsed.database)],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    return [
        _sorted_arrays(line)
        for line in out.splitlines()
        if line.strip() and not line.startswith(("--", "SET ", "SELECT pg_catalog", "\\"))
    ]


def _sqlite_schema(path: Path) -> list[tuple[str, str, str, str]]:
    """sqlite_master, each statement's whitespace collapsed (batch mode wrote its own)."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    return sorted(
        (t, n, tbl, re.sub(r"\s*([(),])\s*", r"\1", " ".join((sql or "").split())))
        for t, n, tbl, sql in rows
    )


@pytest.fixture
def pg_pair(pg_server: PgServer) -> Iterator[tuple[str, str]]:
    names = [create_database(pg_server) for _ in range(2)]
    yield pg_server.url_for(names[0]), pg_server.url_for(names[1])
    for name in names:
        drop_database(pg_server, name)


@pytest.mark.pg
def test_the_baseline_is_the_old_head_on_postgres(pg_pair: tuple[str, str]) -> None:
    old, new = pg_pair
    old_upgrade(old)
    # The code lists grow without a revision: compare after writing today's lists into the old
    # store's policies, as `db upgrade` does (schema.refresh), so only the schema's shape counts.
    engine = create_engine(parse_store_url(old).url)
    try:
        with engine.begin() as conn:
            schema.refresh(conn)
    finally:
        engine.dispose()
    assert migrate.upgrade(new, "0016") == "0016"
    assert _pg_schema(new) == _pg_schema(old)
    # Policies, grants and functions are in the dump; said again so a dump that left them out
    # would not pass for equal.
    dumped = "\n".join(_pg_schema(new))
    assert dumped.count("CREATE POLICY") == 19 and "SECURITY DEFINER" in dumped
    assert "GRANT UPDATE(state) ON TABLE public.deliveries TO crossintercom_hosts" in dumped


def test_the_baseline_is_the_old_head_on_sqlite(tmp_path: Path) -> None:
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    old_upgrade(f"sqlite:///{old}")
    assert migrate.upgrade(f"sqlite:///{new}", "0016") == "0016"
    assert _sqlite_schema(new) == _sqlite_schema(old)
    assert len(_sqlite_schema(new)) > 30


# --- an old-head store with data ------------------------------------------------------------


def _rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    engine = create_engine(parse_store_url(url).url)
    try:
        with engine.connect() as conn:
            return {
                t: sorted(conn.execute(text(f"SELECT * FROM {t}")).all(), key=repr)
                for t in (*schema.TABLES, "alembic_version")
            }
    finally:
        engine.dispose()


def _fill(url: str) -> None:
    """Mail A sent B (one delivered, one refused, one still queued), a late receipt with a
    note, a receipt A has not read, a reservation, and both hosts' rosters. Written at the old
    head by this code, which touches none of the later revisions' columns here."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(migrate, "head_revision", lambda: "0016")
        store = run(open_store(url))
    try:
        ga, gb = run(store.claim_host("host-a")), run(store.claim_host("host-b"))
        assert run(store.publish_sessions("host-a", ga, [SessionInfo(id="sa", host="host-a")]))
        assert run(store.publish_sessions("host-b", gb, [SessionInfo(id="sb", host="host-b")]))
        items = [
            OutboundItem(f"m{i}", "host-a", "host-b", "sb", f"{i:064d}",
                         {"id": f"m{i}", "from": {"id": "sa", "host": "host-a"}}, 40)
            for i in range(3)
        ]  # fmt: skip
        run(store.enqueue(items, generation=ga))
        rows = {r.message_id: r for r in run(store.fetch_inbound("host-b", gb))}
        acks = [
            Ack("m0", "sb", "delivered", seq=rows["m0"].seq),
            Ack("m1", "sb", "refused", "sender_refused", seq=rows["m1"].seq),
        ]
        assert run(store.ack("host-b", gb, acks)) == 2
        late = LateReceipt("m0", "sb", "host-a", "sa", "acknowledged", note="done")
        assert run(store.add_receipts("host-b", gb, [late])) == 1
        assert run(
            store.reserve("host-b", gb, project="p", session_id="sb", globs=["src/**"],
                          mode="exclusive", ttl_s=3600, reason="refactor")
        ) is not None  # fmt: skip
    finally:
        run(store.aclose())


def _carried(url: str) -> None:
    old_upgrade(url)
    _fill(url)
    before = _rows(url)
    assert before["receipts"] and before["reservations"] and before["host_roles"]
    assert migrate.upgrade(url, "0016") == "0016"
    assert _rows(url) == before
    # The revisions after the baseline take it on from there (hosts gain empty columns).
    assert migrate.upgrade(url) == migrate.HEAD_REVISION
    store = run(open_store(url))
    try:
        # (before host-b claims again: a new generation lapses its old one's reservations)
        assert [h.glob for h in run(store.reservations("p"))] == ["src/**"]
        gb = run(store.claim_host("host-b"))
        assert [r.message_id for r in run(store.fetch_inbound("host-b", gb))] == ["m2"]
        ga = run(store.claim_host("host-a"))
        got = {(r.message_id, r.outcome, r.code) for r in run(store.receipts("host-a", ga))}
        assert ("m1", "refused", "sender_refused") in got and ("m0", "acknowledged", None) in got
    finally:
        run(store.aclose())


def test_an_old_head_sqlite_store_is_carried_with_nothing_lost(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    old_upgrade(url)
    engine = create_engine(parse_store_url(url).url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO host_roles VALUES ('ci_host_b', 'host-b')"))
    engine.dispose()
    _carried(url)


@pytest.mark.pg
def test_an_old_head_postgres_store_is_carried_with_nothing_lost(
    pg_server: PgServer, pg_empty_url: str
) -> None:
    old_upgrade(pg_empty_url)
    role, _ = grant_host(pg_empty_url, "host-c", PASSWORD)
    try:
        _carried(pg_empty_url)
    finally:
        drop_host_roles(pg_server, [role], pg_empty_url)


def test_a_store_at_an_older_revision_of_the_old_chain_is_told_what_to_do(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    old_upgrade(url, "0011")
    with pytest.raises(SchemaOutdated, match=r"0011 of crossintercom 0\.1\.0.*first"):
        migrate.upgrade(url)
    assert migrate.current(url) == "0011"


# --- codes without revisions ------------------------------------------------------------------


def _checks(libpq: str) -> dict[str, str]:
    with psycopg.connect(libpq) as conn:
        rows = conn.execute(
            "SELECT policyname, with_check FROM pg_policies WHERE with_check LIKE '%not_found%'"
        ).fetchall()
    return {str(n): str(c) for n, c in rows}


@pytest.mark.pg
def test_db_upgrade_writes_a_new_code_into_the_policies(pg_empty_url: str) -> None:
    """A store made before a code existed (here: its policies written without
    ``already_resent``) takes the code after `db upgrade`, with no revision; a store already
    in step is left alone."""
    libpq = pg_empty_url.replace("+psycopg", "")
    migrate.upgrade(pg_empty_url)
    made = _checks(libpq)
    assert sorted(made) == ["deliveries_finish", "deliveries_send", "receipts_write"]
    with psycopg.connect(libpq, autocommit=True) as conn:
        for policy in schema.listed_checks():
            check = schema.filled(policy.check).replace("'already_resent', ", "")
            conn.execute(f"ALTER POLICY {policy.name} ON {policy.table} WITH CHECK ({check})")
    assert all("'already_resent'" not in c for c in _checks(libpq).values())
    migrate.upgrade(pg_empty_url)
    assert _checks(libpq) == made
    engine = create_engine(parse_store_url(pg_empty_url).url)
    try:
        with engine.begin() as conn:
            assert schema.refresh(conn) == []
    finally:
        engine.dispose()
