"""Upgrading a store that has live host roles: roles granted before keep their traffic flowing
while `db upgrade` rewrites the policies, and an admin that does not own the database is told
what is left to do."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from crossintercom.models import SessionInfo
from crossintercom.storage import open_store, schema
from crossintercom.storage.blocking import run
from crossintercom.storage.migrate import upgrade
from crossintercom.storage.roles import grant_host, lock_database
from tests.hostroles import drop_host_roles, role_url
from tests.pgharness import PgServer
from tests.storage.old_migrations import old_upgrade

pytestmark = pytest.mark.pg
PASSWORD = "live-r0le"


def test_upgrading_a_live_store_keeps_its_host_roles_working(
    pg_server: PgServer, pg_empty_url: str
) -> None:
    """Roles granted on a store version 0.1.0 made keep their traffic flowing through the
    upgrade, here one whose policies take a code fewer than this version's list, so the
    upgrade rewrites them: statements wait for its short transaction, then run under the
    new rules."""
    old_upgrade(pg_empty_url)
    role, _ = grant_host(pg_empty_url, "live", PASSWORD)
    listed = schema.listed_checks()
    behind = [(p, schema.filled(p.check).replace("'already_resent', ", "")) for p in listed]
    # as a role granted before this version: no CONNECT of its own, PUBLIC's instead
    database = make_url(pg_empty_url).database or ""
    with pg_server.admin() as admin:
        for stmt in ("GRANT CONNECT, TEMPORARY ON DATABASE {} TO PUBLIC",
                     "REVOKE CONNECT ON DATABASE {} FROM " + role):  # fmt: skip
            admin.execute(sql.SQL(stmt).format(sql.Identifier(database)))
    with psycopg.connect(pg_empty_url.replace("+psycopg", ""), autocommit=True) as owner:
        for policy, check in behind:
            owner.execute(f"ALTER POLICY {policy.name} ON {policy.table} WITH CHECK ({check})")
    url = role_url(pg_empty_url, role, PASSWORD)
    libpq = url.replace("+psycopg", "")
    errors: list[BaseException] = []
    beats = [0]
    stop = threading.Event()

    def traffic() -> None:
        try:
            with psycopg.connect(libpq, autocommit=True) as conn:
                conn.execute("INSERT INTO hosts (host_id, generation, heartbeat) VALUES "
                             "('live', 1, 0)")  # fmt: skip
                while not stop.is_set():
                    conn.execute("UPDATE hosts SET heartbeat = heartbeat + 1")
                    conn.execute("SELECT count(*) FROM roster").fetchone()
                    beats[0] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while beats[0] < 5 and time.monotonic() < deadline and not errors:
            time.sleep(0.05)
        upgrade(pg_empty_url)
        with psycopg.connect(pg_empty_url.replace("+psycopg", "")) as owner:
            checks = owner.execute(
                "SELECT count(*) FROM pg_policies WHERE with_check LIKE '%already_resent%'"
            ).fetchone()
        assert checks == (len(behind),)  # the policies were rewritten under the traffic
        assert lock_database(pg_empty_url) is not None  # what `db upgrade` does next
        before = beats[0]
        while beats[0] < before + 5 and time.monotonic() < deadline + 30 and not errors:
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join(30)
    try:
        assert errors == [] and beats[0] >= before + 5
        store = run(open_store(url))  # a new connection: the role kept CONNECT
        try:
            gen = run(store.claim_host("live"))
            assert run(store.publish_sessions("live", gen, [SessionInfo(id="l1", host="live")]))
        finally:
            run(store.aclose())
    finally:
        drop_host_roles(pg_server, [role], pg_empty_url)


def test_grant_host_by_a_role_that_does_not_own_the_database_says_what_is_left(
    pg_server: PgServer, pg_url: str
) -> None:
    """An admin that may create roles and map them, but does not own the database, cannot take
    CONNECT and TEMPORARY from PUBLIC: it says so, naming the statements for the owner."""
    admin = f"ci_test_admin_{uuid.uuid4().hex[:8]}"
    database = make_url(pg_url).database or ""
    made: list[str] = []
    with pg_server.admin() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE").format(sql.Identifier(admin)))
    try:
        with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(sql.SQL("GRANT ALL ON host_roles TO {}").format(sql.Identifier(admin)))
        role, line = grant_host(role_url(pg_url, admin, PASSWORD), "not-owned", PASSWORD)
        made.append(role)
        assert "does not own the database" in line and "REVOKE TEMPORARY, CONNECT" in line
        assert f"GRANT CONNECT ON DATABASE {database} TO {role}" in line
    finally:
        drop_host_roles(pg_server, made, pg_url)
        with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(sql.SQL("REVOKE ALL ON host_roles FROM {}").format(sql.Identifier(admin)))
        with pg_server.admin() as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(admin)))
