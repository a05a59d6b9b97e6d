"""SQLite backend for a database file on a (possibly shared) filesystem.

The engine (rollback journal, never WAL; ``BEGIN IMMEDIATE`` for writers; busy timeout) and the
file checks live in ``storage.engine``; its driver runs each transaction in a worker thread
(``driver.SqliteDriver``); this module adds doorbell wake-ups.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from crossintercom.storage import engine as db
from crossintercom.storage import sqlitetrust
from crossintercom.storage.driver import SqliteDriver
from crossintercom.storage.sqlstore import SqlMailboxStore
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import ROSTER, DoorbellWaiter, doorbell_dir, ring_doorbell

log = logging.getLogger(__name__)

_OBJECTS = "SELECT type, name, sql FROM sqlite_master WHERE type IN ('trigger', 'view')"


class SqliteStore(SqlMailboxStore):
    dialect = "sqlite"
    skip_locked = False

    def __init__(self, parsed: StoreURL, *, polling_observer: bool = False) -> None:
        assert parsed.path is not None
        self.path = parsed.path
        self.polling_observer = polling_observer
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
        """Triggers and views the schema does not define, and files others may use."""
        rows = await self._run(
            lambda c: [tuple(r) for r in c.exec_driver_sql(_OBJECTS).all()],
            single_statement=True,
        )
        found = sqlitetrust.foreign_objects(rows)
        return found + sqlitetrust.loose_modes(self.path, doorbell_dir(self.path))

    def waiter(self, host_id: str) -> DoorbellWaiter:
        return DoorbellWaiter(self.path, host_id, polling=self.polling_observer)
