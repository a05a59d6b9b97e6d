"""SQLite backend for a database file on a (possibly shared) filesystem.

Rollback journal, never WAL: WAL's shared memory does not work across hosts. Writers take the
write lock up front (``BEGIN IMMEDIATE``) so two writers never deadlock upgrading read locks.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Collection
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from crossintercom.errors import SchemaMissing, StoreError, StoreReadOnly, StoreUnavailable
from crossintercom.storage.sqlstore import SqlMailboxStore, one_line
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import DoorbellWaiter, ring_doorbell

BUSY_TIMEOUT_S = 30
POOL_SIZE = 2
# Execution option: run each statement in its own (implicit) transaction, no BEGIN IMMEDIATE.
AUTOCOMMIT = "crossintercom_autocommit"


def sqlite_engine(parsed: StoreURL) -> Engine:
    engine = create_engine(
        parsed.url,
        pool_size=POOL_SIZE,
        max_overflow=0,
        connect_args={"timeout": BUSY_TIMEOUT_S},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # Take BEGIN away from the sqlite3 module; the "begin" hook below emits our own.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=DELETE")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if not conn.get_execution_options().get(AUTOCOMMIT):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


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


class SqliteStore(SqlMailboxStore):
    dialect = "sqlite"
    skip_locked = False

    def __init__(self, parsed: StoreURL, *, polling_observer: bool = False) -> None:
        assert parsed.path is not None
        check_writable(parsed.path, parsed.masked, must_exist=True)
        self.path = parsed.path
        self.polling_observer = polling_observer
        super().__init__(parsed, sqlite_engine(parsed))

    def _is_connection_error(self, exc: DBAPIError) -> bool:
        # "database is locked" past the busy timeout, "unable to open database file", I/O errors
        return isinstance(exc.orig, sqlite3.OperationalError) and "readonly" not in str(exc.orig)

    def _commit_failed(self, exc: SQLAlchemyError) -> StoreError:
        # A failed SQLite COMMIT leaves the transaction unapplied: not in doubt, just failed.
        return StoreUnavailable(f"could not commit to the store {self.url_masked}: {one_line(exc)}")

    def _autocommit(self, conn: Connection) -> Connection:
        # A lone statement takes the locks it needs itself; a read then leaves writers alone.
        return conn.execution_options(**{AUTOCOMMIT: True})

    def _after_commit(self, host_ids: Collection[str]) -> None:
        for host_id in host_ids:
            ring_doorbell(self.path, host_id)

    def waiter(self, host_id: str) -> DoorbellWaiter:
        return DoorbellWaiter(self.path, host_id, polling=self.polling_observer)
