"""A compromised host attacks path reservations as its own role (PostgreSQL, per-host roles as
docs/operations.md sets them up): it reads every host's reservations of its store (conflicts
need them) but makes, renews and releases only its own host's, at its current generation; by
direct statements and with temporary objects standing in for what the policies read."""

from __future__ import annotations

from typing import TypedDict

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from crossintercom.errors import StoreError, StoreUnavailable
from crossintercom.models import SessionInfo
from crossintercom.reservations import Mode
from crossintercom.storage import queries as q
from crossintercom.storage.blocking import run
from tests.pgharness import PgServer
from tests.storage.test_host_roles_attack import Conn, Host, hosts  # noqa: F401  (a fixture)

pytestmark = pytest.mark.pg
P = "git.example.org/team/app"


class _Kw(TypedDict):
    project: str
    mode: Mode
    ttl_s: float
    reason: str | None


KW: _Kw = {"project": P, "mode": "exclusive", "ttl_s": 600, "reason": None}

SHADOWS = [
    [],
    [
        "CREATE TEMP TABLE host_roles (role_name text, host_id text)",
        "INSERT INTO host_roles VALUES (session_user, '{b}')",
    ],
    [
        "CREATE TEMP TABLE hosts (host_id text, generation bigint)",
        "INSERT INTO hosts VALUES ('{b}', {gen})",
    ],
    [
        "CREATE FUNCTION pg_temp.crossintercom_host() RETURNS text LANGUAGE sql "
        "AS $$ SELECT '{b}'::text $$",
    ],
]


def _row(host: str, gen: int, rid: str) -> str:
    return (
        "INSERT INTO public.reservations (id, project, glob, mode, host_id, session_id, "
        f"generation, created, expires_at) VALUES ('{rid}', '{P}', '**', 'exclusive', "
        f"'{host}', 'sa', {gen}, now(), now() + interval '1 day')"
    )


def _attack(conn: Conn, a: Host, b: Host, b_gen: int) -> None:
    # reads every host's: a conflict check needs them
    seen = conn.execute("SELECT host_id, glob FROM public.reservations ORDER BY glob")
    assert (b.host, "src/**") in seen.fetchall()
    # makes none as another host, nor as itself at a generation that is not current
    for stmt in (_row(b.host, b_gen, "forged-b"), _row(a.host, a.gen + 7, "stale-a")):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(stmt)
    # changes no row (renewing is the owner's delete and insert) and deletes none of B's
    for stmt in (
        "UPDATE public.reservations SET expires_at = now()",
        f"UPDATE public.reservations SET host_id = '{a.host}'",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(stmt)
    gone = conn.execute(f"DELETE FROM public.reservations WHERE host_id = '{b.host}'")
    assert gone.rowcount == 0


def test_a_host_role_writes_and_releases_only_its_own_reservations(
    hosts: dict[str, Host],  # noqa: F811
    pg_server: PgServer,
    pg_url: str,
) -> None:
    a, b = hosts["A"], hosts["B"]
    b_gen = run(b.store.claim_host(b.host))
    run(b.store.publish_sessions(b.host, b_gen, [SessionInfo(id="sb", host=b.host)]))
    made = run(b.store.reserve(b.host, b_gen, session_id="sb", globs=["src/**"], **KW))
    assert made is not None and made.conflicts == []
    # every operation of A's relay runs under its role
    run(a.store.publish_sessions(a.host, a.gen, [SessionInfo(id="sa", host=a.host)]))
    clash = run(a.store.reserve(a.host, a.gen, session_id="sa", globs=["src/x.py"], **KW))
    assert clash is not None and [h.host for h in clash.conflicts] == [b.host]
    mine = run(a.store.reserve(a.host, a.gen, session_id="sa", globs=["docs/**"], **KW))
    assert mine is not None and [h.glob for h in mine.held] == ["docs/**"]
    assert run(a.store.release(a.host, a.gen, project=P, session_id="sb", globs=None)) == 0
    assert run(a.store.sweep_reservations(a.host, a.gen)) == 0
    assert run(a.store.release(a.host, a.gen, project=P, session_id="sa", globs=None)) == 1

    database = make_url(pg_url).database or ""
    with pg_server.admin() as admin:  # where an admin left TEMPORARY granted
        admin.execute(
            sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
                sql.Identifier(database), sql.Identifier(a.role)
            )
        )
    for statements in SHADOWS:
        with a.connect() as conn:
            for stmt in statements:
                conn.execute(stmt.format(a=a.host, b=b.host, gen=b_gen))
            try:
                _attack(conn, a, b, b_gen)
            except AssertionError as exc:
                raise AssertionError(f"shadowed by {statements}: {exc}") from exc
    assert [(h.host, h.glob) for h in run(a.store.reservations(P))] == [(b.host, "src/**")]


def test_a_row_planted_for_another_host_s_session_stands_in_no_one_s_way(
    hosts: dict[str, Host],  # noqa: F811
) -> None:
    """A host may make rows of its own host only, but it names the session: one planted for
    B's session id (already expired, so no listing shows it) once made B's own reservation of
    that glob fail, and B could not delete it (the key holds the host)."""
    a, b = hosts["A"], hosts["B"]
    run(b.store.publish_sessions(b.host, b.gen, [SessionInfo(id="sb", host=b.host)]))
    with a.connect() as conn:
        conn.execute(
            "INSERT INTO public.reservations (id, project, glob, mode, host_id, session_id, "
            "generation, created, expires_at) VALUES ('squat', %s, 'src/**', 'exclusive', "
            "%s, 'sb', %s, now() - interval '2 days', now() - interval '1 day')",
            (P, a.host, a.gen),
        )
    made = run(b.store.reserve(b.host, b.gen, session_id="sb", globs=["src/**"], **KW))
    assert made is not None and [h.glob for h in made.held] == ["src/**"]
    assert [(h.host, h.session) for h in run(b.store.reservations(P))] == [(b.host, "sb")]


def test_a_host_holding_a_project_s_lock_is_named_not_waited_for(
    hosts: dict[str, Host],  # noqa: F811
) -> None:
    """A host role may take any advisory lock, the one a project's reserves serialise on
    included: another host's reserve of that project is refused with why, after a short wait,
    instead of hanging until the statement timeout and saying the store is unreachable."""
    a, b = hosts["A"], hosts["B"]
    run(b.store.publish_sessions(b.host, b.gen, [SessionInfo(id="sb", host=b.host)]))
    with a.connect() as conn:
        conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (q.PG_RESERVATION_LOCK_KEY, P))
        with pytest.raises(StoreError, match="held the reservations of project") as refused:
            run(b.store.reserve(b.host, b.gen, session_id="sb", globs=["src/**"], **KW))
        assert not isinstance(refused.value, StoreUnavailable)
    made = run(b.store.reserve(b.host, b.gen, session_id="sb", globs=["src/**"], **KW))
    assert made is not None and [h.glob for h in made.held] == ["src/**"]
