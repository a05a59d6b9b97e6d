"""SQLite backend for a database file on a (possibly shared) filesystem.

The engine (rollback journal, never WAL; ``BEGIN IMMEDIATE`` for writers; busy timeout) and the
file checks live in ``storage.engine``; its driver runs each transaction in a worker thread
(``driver.SqliteDriver``); this module adds doorbell wake-ups.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from crossintercom.models import SessionInfo
from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage import sqlitetrust
from crossintercom.storage.driver import SqliteDriver
from crossintercom.storage.hosts import ROSTER_PER_HOST
from crossintercom.storage.hosts import _session_info as session_info
from crossintercom.storage.sqlstore import SqlMailboxStore
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import (
    POLL_INTERVAL_S,
    ROSTER,
    DoorbellWaiter,
    doorbell_dir,
    polling_needed,
    ring_doorbell,
)

log = logging.getLogger(__name__)

_OBJECTS = "SELECT type, name, sql FROM sqlite_master WHERE type IN ('trigger', 'view')"


class SqliteStore(SqlMailboxStore):
    dialect = "sqlite"
    skip_locked = False

    def __init__(self, parsed: StoreURL, *, polling_observer: bool | None = None) -> None:
        """``polling_observer``: watch the doorbells by polling (True), with inotify (False),
        or as the store's filesystem needs (None: polling where it carries no change
        notifications across machines, ``wakeup.polling_needed``)."""
        assert parsed.path is not None
        self.path = parsed.path
        fs_type = polling_needed(parsed.path)
        self.polling_observer = (
            fs_type is not None if polling_observer is None else polling_observer
        )
        self.wakeup_note = _wakeup_note(self.polling_observer, polling_observer, fs_type)
        # must_exist: opening a store never creates an empty file; `db upgrade` does.
        super().__init__(parsed, SqliteDriver(parsed, db.store_engine(parsed, must_exist=True)))

    def _after_commit(self, host_ids: Collection[str], kind: str) -> None:
        for host_id in host_ids:
            self._ring(host_id, kind)

    def _after_roster_commit(self) -> None:
        self._ring("", ROSTER)  # the one roster doorbell (wakeup.doorbell_path)

    def _ring(self, host_id: str, kind: str) -> None:
        try:
            ring_doorbell(self.path, host_id, kind)
        except OSError as exc:
            # The write committed: a doorbell is only a hint, and the recipient's poll
            # backstop finds the row. Failing here would report a committed write as lost.
            log.warning(
                "doorbell for host %s (%s) not rung: %s; its relay finds the rows by polling",
                host_id or "every host",
                kind,
                exc,
                extra={"host_id": host_id, "error": str(exc)},
            )

    async def trust_warnings(self) -> list[str]:
        """Triggers and views the schema does not define, files others may use, and the
        doorbells' polling when the relay chose it or was told to (shown in `status`)."""
        rows = await self._run(
            lambda c: [tuple(r) for r in c.exec_driver_sql(_OBJECTS).all()],
            single_statement=True,
        )
        found = sqlitetrust.foreign_objects(rows)
        found += sqlitetrust.loose_modes(self.path, doorbell_dir(self.path))
        return found + ([self.wakeup_note] if self.wakeup_note else [])

    def waiter(self, host_id: str) -> DoorbellWaiter:
        return DoorbellWaiter(self.path, host_id, polling=self.polling_observer)


def _wakeup_note(polling: bool, asked: bool | None, fs_type: str | None) -> str | None:
    """How the doorbells are watched, for `status`, where it is not the default inotify."""
    if polling and asked is None:
        return (
            f"doorbells polled every {POLL_INTERVAL_S} s: the store is on {fs_type}, which "
            "carries no change notifications across machines (--no-polling-observer to watch "
            'with inotify; docs/operations.md, "Shared filesystems")'
        )
    if polling:
        return f"doorbells polled every {POLL_INTERVAL_S} s (--polling-observer)"
    if fs_type is not None:
        return (
            f"WARNING doorbells watched with inotify on {fs_type} (--no-polling-observer): "
            "writes from other machines wake this relay only at its heartbeat's poll"
        )
    return None


def roster_without_locks(path: Path) -> list[SessionInfo]:
    """The roster as the file holds it, read without taking a single lock (``immutable``): for
    a relay whose filesystem's locks do not exclude (storage/lockcheck.py), which must not
    even read the store the usual way, since a reader that takes a live writer's journal for
    a crashed one's rolls it back into the file. The read may be torn: rows that do not parse
    are left out, and a file that does not read at all gives none."""
    uri = f"sqlite:///{path.resolve().as_uri()}?mode=ro&immutable=1&uri=true"
    engine = create_engine(uri, poolclass=NullPool)
    out = []
    try:
        with engine.connect() as conn:
            for row in conn.execute(q.LIST_ROSTER, {"per_host": ROSTER_PER_HOST}):
                info = session_info(row._mapping)
                if info is not None:
                    out.append(info)
    except SQLAlchemyError as exc:
        log.warning("the roster could not be read from %s: %s", path, exc)
    finally:
        engine.dispose()
    return out
