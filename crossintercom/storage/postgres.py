"""PostgreSQL backend: psycopg 3 under SQLAlchemy Core, NOTIFY wake-ups.

Its engine (pool, timeouts, keepalives) and error wording come from ``storage.engine``.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import Connection

from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage.interface import StuckTransaction
from crossintercom.storage.sqlstore import SqlMailboxStore
from crossintercom.storage.tables import metadata
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import PostgresWaiter, channel_name


class PostgresStore(SqlMailboxStore):
    dialect = "postgresql"
    skip_locked = True

    def __init__(self, parsed: StoreURL) -> None:
        engine = db.store_engine(parsed, statement_timeout_ms=db.PG_STATEMENT_TIMEOUT_MS)
        super().__init__(parsed, engine, deadline_s=db.PG_OPERATION_DEADLINE_S)

    def _notify_in_txn(self, conn: Connection, host_ids: Collection[str]) -> None:
        # Delivered at commit, once per channel per transaction (Postgres folds duplicates).
        channels = sorted({channel_name(host_id) for host_id in host_ids})
        conn.execute(q.PG_NOTIFY, {"channels": channels})

    def notify_hosts(self, host_ids: Collection[str]) -> None:
        self._run(lambda c: self._notify_in_txn(c, host_ids))

    def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        params = {"idle_s": idle_s, "tables": sorted(metadata.tables)}
        rows = self._run(
            lambda c: c.execute(q.PG_STUCK_TRANSACTIONS, params).all(), single_statement=True
        )
        return [
            StuckTransaction(int(pid), user, app or None, client, float(idle), tuple(tables))
            for pid, user, app, client, idle, tables in rows
        ]

    def waiter(self, host_id: str) -> PostgresWaiter:
        return PostgresWaiter(
            self.parsed.libpq_conninfo(), host_id, lambda: self.notify_hosts({host_id})
        )
