"""Refuse a connection pooler that hands a client's server session to other clients between
transactions (PgBouncer's transaction or statement mode; docs/operations.md, "Poolers").

The relay and ``db upgrade`` keep state in their PostgreSQL session: the listener's LISTEN,
the statements psycopg prepares on the server, the migration's advisory lock. Behind such a
pooler the NOTIFYs go to whichever client holds the server next, a prepared statement is
missing on the next server, and a lock taken on one server is released on another (never).

A client cannot ask PgBouncer its mode (``SHOW pool_mode`` is for its admin console), so the
check watches what the mode does. Client A reads its backend's pid and ends its transaction;
client B opens a transaction and reads its own; A reads again. With a session of its own
(PostgreSQL directly, a session-mode pooler) A sees the same pid twice and B another one. A
pooler that shares servers between transactions either gives B the server A just released
(PgBouncer reuses the most recently released server first), or moves A to another server.
"""

from __future__ import annotations

from typing import Any

import psycopg

from crossintercom.errors import StoreError
from crossintercom.storage.engine import pg_connect_args, unavailable
from crossintercom.storage.urls import parse_store_url

_PID = "SELECT pg_backend_pid()"


def require_own_session(url: str) -> None:
    """Raise ``StoreError`` (not retried: waiting does not change it) when ``url`` leads
    through a pooler in transaction or statement mode; ``StoreUnavailable`` when it cannot be
    reached."""
    parsed = parse_store_url(url)
    if parsed.kind != "postgres":
        return
    conninfo = parsed.libpq_conninfo()
    args: dict[str, Any] = {**pg_connect_args(), "autocommit": True, "prepare_threshold": None}
    try:
        with psycopg.connect(conninfo, **args) as a, psycopg.connect(conninfo, **args) as b:
            first = _pid(a)
            with b.transaction():
                held = _pid(b)
                # Shared already: A asks no more (in a pool of one server it would wait on B).
                again = first if held == first else _pid(a)
    except psycopg.Error as exc:
        if "pooling mode" in str(exc):  # PgBouncer's statement mode refuses the BEGIN
            raise _refusal(parsed.masked, "statement") from None
        raise unavailable(parsed, exc) from None
    if held == first or again != first:
        raise _refusal(parsed.masked, "transaction")


def _pid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(_PID).fetchone()
    assert row is not None
    return int(row[0])


def _refusal(masked: str, mode: str) -> StoreError:
    return StoreError(
        f"the store {masked} is reached through a connection pooler in {mode} mode (two "
        "clients were served by one PostgreSQL session): crossintercom keeps LISTEN, prepared "
        "statements and advisory locks in its session; set pool_mode = session for this "
        "database in the pooler (PgBouncer), or connect to PostgreSQL directly "
        '(docs/operations.md, "Poolers")'
    )
