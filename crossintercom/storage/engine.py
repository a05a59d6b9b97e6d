"""Engines for both dialects, and what their errors mean to a caller.

The one place that turns a ``StoreURL`` into a SQLAlchemy engine (pool size, connect options,
SQLite pragmas and ``BEGIN IMMEDIATE``) and a driver error into a ``StoreError`` subclass. The
stores, ``migrate`` and the Alembic environment all open the database through here, so a store
and a migration of it connect the same way and fail with the same words.

Contract of the translation: ``StoreUnavailable`` means nothing was written (safe to retry);
``StoreInDoubt`` means a COMMIT was lost on the way and the write may have landed; any other
``StoreError`` is a failure a retry will not cure. Messages are one line, password masked.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError

from crossintercom.errors import (
    SchemaDamaged,
    SchemaMissing,
    StoreError,
    StoreInDoubt,
    StoreReadOnly,
    StoreUnavailable,
)
from crossintercom.storage import queries as q
from crossintercom.storage import sqlitetrust
from crossintercom.storage.plans import PlanRefresh
from crossintercom.storage.urls import StoreURL

# Two pooled connections per SQLite engine (each transaction in a worker thread; the file's
# lock serialises writers anyway). A PostgreSQL store holds one statement connection, its
# archive's operations included, plus the listener a waiter opens: at most two database
# connections per relay (docs/storage.md, "Connections").
POOL_SIZE = 2
PG_POOL_SIZE = 1

PG_CONNECT_TIMEOUT_S = 5
PG_IDLE_IN_TXN_MS = 30_000
# A store's statements are short; one the server has not finished in this time is cancelled
# by the server (a lock held by a frozen peer, an overloaded database). Not for migrations.
PG_STATEMENT_TIMEOUT_MS = 10_000
# Past this, an operation whose server never answers (a blackholed connection: no error, no
# reply) has its socket cut by the client and the connection replaced (pgdriver.py).
PG_OPERATION_DEADLINE_S = 15.0
# Idle keepalives notice a dead peer (NAT drop, cable pull) that would otherwise leave a
# connection, the listener's above all, waiting forever on a half-open socket; the TCP user
# timeout does the same for data sent and never acknowledged.
PG_KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}

# A backend's application_name is cut by the server past NAMEDATALEN - 1 bytes.
PG_APP_NAME_BYTES = 63
PLANS_KEY = "crossintercom_plans"  # a pooled connection's PlanRefresh, in its record's info
# A refresh due on a pooled connection, for the next transaction on it to run first.
PLANS_DUE_KEY = "crossintercom_plans_due"

SQLITE_BUSY_TIMEOUT_S = 30
# Execution option: run each statement in its own (implicit) transaction, no BEGIN IMMEDIATE.
SQLITE_AUTOCOMMIT = "crossintercom_autocommit"


# -- engines -------------------------------------------------------------------------------


def application_name(*who: str) -> str:
    """``crossintercom ROLE HOST``: who holds a backend, in ``pg_stat_activity`` (and so in
    `status`'s stuck-transaction report, the bench's connections per host). Printable ASCII
    (anything else escaped, as the server would mangle it) and at most PG_APP_NAME_BYTES."""
    name = " ".join(("crossintercom", *who))
    clean = "".join(
        ch if " " <= ch <= "~" else ch.encode("unicode_escape").decode("ascii") for ch in name
    )
    return clean[:PG_APP_NAME_BYTES]


def store_engine(
    parsed: StoreURL,
    *,
    must_exist: bool = True,
    pool_size: int = POOL_SIZE,
    statement_timeout_ms: int | None = None,
    app_name: str | None = None,
) -> Engine:
    """The engine for ``parsed``. A SQLite file is checked first (``check_writable``), so an
    unusable path fails with its reason; ``must_exist=False`` lets a migration create it.
    ``app_name``: the PostgreSQL connections' ``application_name`` (``application_name()``)."""
    if parsed.kind == "postgres":
        return postgres_engine(parsed, pool_size, statement_timeout_ms, app_name)
    assert parsed.path is not None
    check_writable(parsed.path, parsed.masked, must_exist=must_exist)
    if not must_exist:
        # Created private before SQLite makes it world-readable (docs/operations.md, "Trust").
        sqlitetrust.create_private(parsed.path, sqlitetrust.configured_gid())
    return sqlite_engine(parsed, pool_size)


def pg_connect_args(
    statement_timeout_ms: int | None = None, app_name: str | None = None
) -> dict[str, Any]:
    """libpq options of every store connection (the blocking engines' and the async one's)."""
    options = f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TXN_MS}"
    if statement_timeout_ms:
        options += f" -c statement_timeout={statement_timeout_ms}"
    return {
        "connect_timeout": PG_CONNECT_TIMEOUT_S,
        # A relay frozen inside a transaction (SIGSTOP, a paused VM) must not hold its
        # locks forever: the server ends such a session, so a successor can take over.
        "options": options,
        # The fallback: an application_name in the URL (or PGAPPNAME) is the user's, and wins.
        "fallback_application_name": app_name or application_name(),
        **PG_KEEPALIVES,
    }


def postgres_engine(
    parsed: StoreURL,
    pool_size: int = POOL_SIZE,
    statement_timeout_ms: int | None = None,
    app_name: str | None = None,
) -> Engine:
    engine = create_engine(
        parsed.url,
        pool_size=pool_size,
        max_overflow=0,
        # No pre-ping (a round trip per transaction): a dropped pooled connection fails
        # before COMMIT, is discarded and the transaction retried (driver.py).
        connect_args=pg_connect_args(statement_timeout_ms, app_name),
    )

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        # Plans made on the tables as they are now (storage/plans.py), on the connection's own
        # schedule; a transaction of its own, so the caller's begins clean.
        refresh = record.info.setdefault(PLANS_KEY, PlanRefresh()).statement()
        if refresh is not None:
            try:
                dbapi_conn.execute(refresh)
                dbapi_conn.commit()
            except psycopg.Error as exc:  # a connection lost while pooled: take a new one
                raise DisconnectionError(str(exc)) from exc

    return engine


def sqlite_engine(parsed: StoreURL, pool_size: int = POOL_SIZE) -> Engine:
    """Rollback journal, never WAL: WAL's shared memory does not work across hosts. Writers
    take the write lock up front (``BEGIN IMMEDIATE``) so two writers never deadlock upgrading
    read locks."""
    engine = create_engine(
        parsed.url,
        pool_size=pool_size,
        max_overflow=0,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # Take BEGIN away from the sqlite3 module; the "begin" hook below emits our own.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=DELETE")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if not conn.get_execution_options().get(SQLITE_AUTOCOMMIT):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def autocommit(conn: Connection) -> Connection:
    """``conn`` running each statement in its own transaction, the dialect's way."""
    if conn.dialect.name == "postgresql":
        return conn.execution_options(isolation_level="AUTOCOMMIT")
    # A lone statement takes the locks it needs itself; a read then leaves writers alone.
    return conn.execution_options(**{SQLITE_AUTOCOMMIT: True})


@contextlib.contextmanager
def unprepared(conn: Connection) -> Iterator[None]:
    """Statements run here are not prepared on the server. psycopg prepares a statement after
    a few runs, in a round trip of its own, which outside a transaction is a commit of its own:
    for the heartbeat, one commit more after each plan refresh (docs/storage.md, "Idle load")."""
    raw: Any = conn.connection.driver_connection
    threshold = getattr(raw, "prepare_threshold", None)
    if threshold is None:  # SQLite, or preparing already off
        yield
        return
    raw.prepare_threshold = None
    try:
        yield
    finally:
        raw.prepare_threshold = threshold


def check_writable(path: Path, masked: str, *, must_exist: bool) -> None:
    """Refuse, with a clear reason, a file SQLite could open but not write.

    Mode bits are checked as well as access(): a root process may write anything, yet a file
    someone made read-only says the store must not be written.
    """
    directory = path.parent
    if not directory.is_dir():
        raise StoreUnavailable(
            f"the directory of the store {masked} does not exist; create {directory} "
            "or fix the path in the store URL"
        )
    if not os.access(directory, os.W_OK) or not directory.stat().st_mode & stat.S_IWUSR:
        raise StoreReadOnly(
            f"the directory {directory} of the store {masked} is read-only; SQLite needs to "
            "write its journal there: make the directory writable"
        )
    if not path.exists():
        if must_exist:
            raise SchemaMissing(
                f"the store {masked} does not exist yet; "
                f"run `crossintercom db upgrade --store {masked}`"
            )
        return
    if not path.is_file():
        raise StoreUnavailable(f"the store {masked} is not a regular file; fix the store URL")
    if not os.access(path, os.R_OK | os.W_OK) or not path.stat().st_mode & stat.S_IWUSR:
        raise StoreReadOnly(
            f"the store file {masked} is read-only; make it writable (chmod u+w) for this user"
        )


# -- errors --------------------------------------------------------------------------------


def one_line(exc: BaseException) -> str:
    """A driver error as one short line (libpq messages span several)."""
    text = str(getattr(exc, "orig", None) or exc)
    parts = [p.strip() for p in text.splitlines() if p.strip()]
    return "; ".join(parts)[:300] or type(exc).__name__


def pg_hint(reason: str) -> str:
    """What a person should check, from libpq's reason."""
    lowered = reason.lower()
    if "does not support ssl" in lowered:
        return "the server offers no TLS: set ssl = on there (docs/operations.md, TLS)"
    if "certificate" in lowered or "ssl error" in lowered:
        return (
            "check the store's TLS files (store_ssl_root_cert, store_ssl_cert, store_ssl_key) "
            "and that the server's certificate names the host in the store URL"
        )
    if "startup parameter" in lowered:
        return (
            "a pooler (PgBouncer) refuses the store's connection options: add "
            "ignore_startup_parameters = options to its configuration (docs/operations.md, Poolers)"
        )
    if "password" in lowered or "authentication" in lowered or "role" in lowered:
        return "check the user name and password in the store URL"
    if "database" in lowered and "does not exist" in lowered:
        return "create that database, or fix its name in the store URL"
    return "check the host and port in the store URL and that PostgreSQL is running there"


# -- failover: a server that is, or has become, read-only ----------------------------------

# A server in recovery (a standby), one shutting down, or a primary demoted or set read-only
# by a failover: the write did not happen, and the host to use is another one now. Treated
# as a lost connection: the connection is dropped, and the next one goes to whichever host
# is the primary (target_session_attrs=read-write; docs/operations.md, "High availability").
FAILOVER_SQLSTATES = frozenset(
    {
        "25006",  # read_only_sql_transaction: "cannot execute ... in a read-only transaction"
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now: "the database system is in recovery mode", starting up
    }
)
_FAILOVER_WORDS = (
    "read-only transaction",
    "during recovery",
    "in recovery mode",
    "is starting up",
    "is shutting down",
    "not yet accepting connections",
    "session is read-only",
)


def is_failover_error(exc: BaseException) -> bool:
    """A driver error (raw, or wrapped by SQLAlchemy) saying the server cannot take writes
    now: a standby, a primary being demoted, shut down or restarted. Nothing was written."""
    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlstate", None) in FAILOVER_SQLSTATES:
        return True
    text = str(orig).lower()
    return isinstance(orig, psycopg.Error) and any(w in text for w in _FAILOVER_WORDS)


def failover_hint(parsed: StoreURL) -> str:
    if len(parsed.hosts) > 1:
        return "reconnecting to the host that is the primary now"
    return (
        "the server is a standby or read-only (a failover?); name every host of the "
        "replica set in the store URL with target_session_attrs=read-write"
    )


def unavailable(parsed: StoreURL, exc: BaseException) -> StoreUnavailable:
    """The store could not be reached (connect failed, connection lost before COMMIT)."""
    reason = one_line(exc)
    if parsed.kind == "postgres" and is_failover_error(exc):
        return StoreUnavailable(
            f"the store {parsed.masked} cannot take writes now: {reason}; {failover_hint(parsed)}"
        )
    if parsed.kind == "postgres":
        return StoreUnavailable(
            f"cannot reach the store {parsed.masked}: {reason}; {pg_hint(reason)}"
        )
    if "database is locked" in reason:
        # Writers hold the lock for one short transaction; one held past the busy timeout is a
        # writer stuck inside it (frozen, SIGSTOPped): it blocks every host until it ends.
        return StoreUnavailable(
            f"the store {parsed.masked} stayed locked for over {SQLITE_BUSY_TIMEOUT_S} s: "
            "another process holds its write lock (a relay frozen inside a transaction?); "
            "every host waits until that process resumes or is ended (docs/operations.md)"
        )
    return StoreUnavailable(f"cannot reach the store {parsed.masked}: {reason}")


def lock_timed_out(exc: DBAPIError) -> bool:
    """A PostgreSQL statement that waited out the transaction's ``lock_timeout``."""
    return getattr(exc.orig, "sqlstate", None) == q.PG_LOCK_NOT_AVAILABLE


def is_connection_error(parsed: StoreURL, exc: DBAPIError) -> bool:
    """The statement failed because the connection did, not because of what it asked."""
    if exc.connection_invalidated:
        return True
    if parsed.kind == "postgres":
        # A read-only server (a standby, a demoted primary) counts as a lost connection too.
        return isinstance(
            exc.orig, psycopg.OperationalError | psycopg.InterfaceError
        ) or is_failover_error(exc)
    # "database is locked" past the busy timeout, "unable to open database file", I/O errors
    return isinstance(exc.orig, sqlite3.OperationalError) and "readonly" not in str(exc.orig)


# SQLite's words for a schema a writer of the file changed after migration.
_DAMAGED_SCHEMA = (
    "no such table",
    "no such column",
    "has no column named",
    "a view",
    "disk image is malformed",
    "file is not a database",
)


def translate(parsed: StoreURL, exc: SQLAlchemyError) -> StoreError:
    """A failure before COMMIT: unavailable (nothing written), a damaged schema or a plain
    store error."""
    reason = one_line(exc)
    if parsed.kind == "sqlite" and any(w in reason for w in _DAMAGED_SCHEMA):
        return SchemaDamaged(
            f"the store {parsed.masked} is damaged: not the schema its version defines, or not "
            f"a whole database ({reason}): a writer of the file renamed, dropped or replaced a "
            "table or column, or truncated or overwrote the file; restore it from a backup "
            '(docs/operations.md, "Trust model")'
        )
    if isinstance(exc, DBAPIError) and is_connection_error(parsed, exc):
        return unavailable(parsed, exc)
    return StoreError(f"store {parsed.masked} failed: {one_line(exc)}")


def commit_failed(parsed: StoreURL, exc: BaseException) -> StoreError:
    """A failed COMMIT (or a lost write sent in autocommit, which is its own COMMIT). On a
    network database its outcome is unknown; a failed SQLite COMMIT leaves the transaction
    unapplied: not in doubt, just failed."""
    if parsed.kind == "sqlite":
        return StoreUnavailable(f"could not commit to the store {parsed.masked}: {one_line(exc)}")
    return StoreInDoubt(
        f"lost the store {parsed.masked} during COMMIT ({one_line(exc)}); "
        "the write may or may not have landed: read it back by id"
    )
