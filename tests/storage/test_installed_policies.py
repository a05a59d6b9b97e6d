"""What the installed row-security policies hold, read from the catalog: every code a receipt
may carry, and the host a role is asked for once per statement (every policy calls
``crossintercom_host()`` only inside a scalar subquery, which the server runs once, not once
per row). A later revision that writes policies afresh must keep both. What the policies
allow is the attack suites' to check (test_host_roles_attack.py and others)."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from crossintercom.codes import RETIRED_CODES, Code
from crossintercom.storage import Ack, OutboundItem, open_store
from crossintercom.storage.blocking import run
from crossintercom.storage.migrate import upgrade
from crossintercom.storage.roles import grant_host
from tests.hostroles import drop_host_roles, role_url
from tests.pgharness import PgServer
from tests.procs import wait_for

pytestmark = pytest.mark.pg
Conn = psycopg.Connection[tuple[object, ...]]
PASSWORD = "c0st-r0le"
MESSAGES = 40

_WRAPPED = re.compile(r"\(\s*SELECT\s+(?:public\.)?crossintercom_host\(\)[^)]*\)")
_BARE = re.compile(r"crossintercom_host\(\)")


def _policies(libpq: str) -> list[tuple[str, str | None, str | None]]:
    """(name, USING, WITH CHECK) of every policy on the store's tables, as the server prints
    them."""
    with psycopg.connect(libpq) as conn:
        rows = conn.execute(
            "SELECT policyname, qual, with_check FROM pg_policies "
            "WHERE schemaname = 'public' ORDER BY policyname"
        ).fetchall()
    assert rows, "no policies installed"
    return [(str(n), _text(u), _text(c)) for n, u, c in rows]


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _bare_calls(libpq: str) -> dict[str, int]:
    """Per policy, the calls of the function that are not a scalar subquery of their own."""
    return {
        name: sum(len(_BARE.findall(_WRAPPED.sub("", c or ""))) for c in (using, check))
        for name, using, check in _policies(libpq)
    }


def test_every_policy_asks_for_the_host_once_per_statement(pg_empty_url: str) -> None:
    libpq = pg_empty_url.replace("+psycopg", "")
    upgrade(pg_empty_url)
    assert len(_policies(libpq)) == 19
    assert {k: v for k, v in _bare_calls(libpq).items() if v} == {}
    # The count sees a bare call where there is one (what a policy written carelessly holds).
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute("ALTER POLICY roster_remove ON roster USING (host_id = crossintercom_host())")
    assert {k: v for k, v in _bare_calls(libpq).items() if v} == {"roster_remove": 1}


def _host_calls(admin: Conn) -> int:
    row = admin.execute(
        "SELECT calls FROM pg_stat_user_functions WHERE funcname = 'crossintercom_host'"
    ).fetchone()
    return int(str(row[0])) if row else 0


def test_a_batch_asks_for_the_host_a_few_times_per_message(
    pg_server: PgServer, pg_url: str
) -> None:
    """Counted by the server (``track_functions``): two host roles' enqueue, fetch and ack of
    40 messages. Called bare in a policy, the function ran 18 times per message (once or more
    per row and policy); the policies ask once per statement, and the row-dependent functions
    (whether a message was addressed to the role's host, received by it) read host_roles
    themselves since revision 0019 (147 calls before, 24 after)."""
    libpq = pg_url.replace("+psycopg", "")
    database = make_url(pg_url).database or ""
    roles: list[str] = []
    with psycopg.connect(libpq, autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(
                sql.Identifier(database)
            )
        )
        try:
            stores = []
            for host in ("cost-a", "cost-b"):
                role, _ = grant_host(pg_url, host, PASSWORD)
                roles.append(role)
                stores.append(run(open_store(role_url(pg_url, role, PASSWORD))))
            a, b = stores
            ga, gb = run(a.claim_host("cost-a")), run(b.claim_host("cost-b"))
            before = _host_calls(admin)
            items = [
                OutboundItem(f"m{i}", "cost-a", "cost-b", "s1", f"{i:064d}", {"id": f"m{i}"}, 20)
                for i in range(MESSAGES)
            ]
            run(a.enqueue(items, generation=ga))
            rows = run(b.fetch_inbound("cost-b", gb, session_ids=["s1"]))
            assert len(rows) == MESSAGES
            run(b.ack("cost-b", gb, [Ack(r.message_id, "s1", "delivered") for r in rows]))
            for store in stores:
                run(store.aclose())
            # A backend's counts reach the shared view before it leaves pg_stat_activity.
            wait_for(lambda: not _backends_of(admin, roles), 30, "the roles' sessions to end")
            calls = _host_calls(admin) - before
        finally:
            drop_host_roles(pg_server, roles, pg_url)
    assert 0 < calls <= MESSAGES, calls


def _backends_of(admin: Conn, roles: list[str]) -> list[tuple[object, ...]]:
    return admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE usename = ANY(%s)", (roles,)
    ).fetchall()


def _code_checks(libpq: str) -> dict[str, str]:
    """The policies that check a code (a receipt's, a delivery's reason): name -> WITH CHECK."""
    return {n: c for n, _, c in _policies(libpq) if c is not None and "'not_found'" in c}


def test_every_code_is_one_a_receipt_may_carry(pg_empty_url: str) -> None:
    """The installed policies take every code of the list and the retired ones, and nothing
    else (test_baseline.py: a code added later is written in by `db upgrade`)."""
    libpq = pg_empty_url.replace("+psycopg", "")
    upgrade(pg_empty_url)
    checks = _code_checks(libpq)
    assert sorted(checks) == ["deliveries_finish", "deliveries_send", "receipts_write"]
    for name, check in checks.items():
        missing = [c.value for c in Code if f"'{c.value}'" not in check]
        assert missing == [], name
        assert all(f"'{c}'" in check for c in RETIRED_CODES), name
