"""SQLite backend for a database file on a (possibly shared) filesystem.

The engine (rollback journal, never WAL; ``BEGIN IMMEDIATE`` for writers; busy timeout) and the
file checks live in ``storage.engine``; this module adds doorbell wake-ups.
"""

from __future__ import annotations

from collections.abc import Collection

from crossintercom.storage import engine as db
from crossintercom.storage.sqlstore import SqlMailboxStore
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import DoorbellWaiter, ring_doorbell


class SqliteStore(SqlMailboxStore):
    dialect = "sqlite"
    skip_locked = False

    def __init__(self, parsed: StoreURL, *, polling_observer: bool = False) -> None:
        assert parsed.path is not None
        self.path = parsed.path
        self.polling_observer = polling_observer
        # must_exist: opening a store never creates an empty file; `db upgrade` does.
        super().__init__(parsed, db.store_engine(parsed, must_exist=True))

    def _after_commit(self, host_ids: Collection[str]) -> None:
        for host_id in host_ids:
            ring_doorbell(self.path, host_id)

    def waiter(self, host_id: str) -> DoorbellWaiter:
        return DoorbellWaiter(self.path, host_id, polling=self.polling_observer)
