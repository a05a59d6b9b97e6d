"""PostgreSQL backend: psycopg 3 under SQLAlchemy Core, NOTIFY wake-ups."""

from __future__ import annotations

from collections.abc import Collection

import psycopg
from sqlalchemy import Connection, create_engine
from sqlalchemy.exc import DBAPIError

from crossintercom.errors import StoreUnavailable
from crossintercom.storage import queries as q
from crossintercom.storage.sqlstore import SqlMailboxStore, one_line
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import KEEPALIVES, PostgresWaiter, channel_name

# Two pooled connections plus the listener: at most three per store object.
POOL_SIZE = 2
CONNECT_TIMEOUT_S = 5
IDLE_IN_TXN_MS = 30_000


def hint_for(message: str) -> str:
    """What a person should check, from libpq's reason."""
    lowered = message.lower()
    if "password" in lowered or "authentication" in lowered or "role" in lowered:
        return "check the user name and password in the store URL"
    if "database" in lowered and "does not exist" in lowered:
        return "create that database, or fix its name in the store URL"
    return "check the host and port in the store URL and that PostgreSQL is running there"


class PostgresStore(SqlMailboxStore):
    dialect = "postgresql"
    skip_locked = True

    def __init__(self, parsed: StoreURL) -> None:
        engine = create_engine(
            parsed.url,
            pool_size=POOL_SIZE,
            max_overflow=0,
            # No pre-ping (a round trip per transaction): a dropped pooled connection fails
            # before COMMIT, is discarded and the transaction retried (SqlMailboxStore._run).
            connect_args={
                "connect_timeout": CONNECT_TIMEOUT_S,
                # A relay frozen inside a transaction (SIGSTOP, a paused VM) must not hold its
                # locks forever: the server ends such a session, so a successor can take over.
                "options": f"-c idle_in_transaction_session_timeout={IDLE_IN_TXN_MS}",
                **KEEPALIVES,
            },
        )
        super().__init__(parsed, engine)

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        reason = one_line(exc)
        return StoreUnavailable(
            f"cannot reach the store {self.url_masked}: {reason}; {hint_for(reason)}"
        )

    def _is_connection_error(self, exc: DBAPIError) -> bool:
        return isinstance(exc.orig, psycopg.OperationalError | psycopg.InterfaceError)

    def _autocommit(self, conn: Connection) -> Connection:
        return conn.execution_options(isolation_level="AUTOCOMMIT")

    def _notify_in_txn(self, conn: Connection, host_ids: Collection[str]) -> None:
        # Delivered at commit, once per channel per transaction (Postgres folds duplicates).
        channels = sorted({channel_name(host_id) for host_id in host_ids})
        conn.execute(q.PG_NOTIFY, {"channels": channels})

    def notify_hosts(self, host_ids: Collection[str]) -> None:
        self._run(lambda c: self._notify_in_txn(c, host_ids))

    def waiter(self, host_id: str) -> PostgresWaiter:
        return PostgresWaiter(
            self.parsed.libpq_conninfo(), host_id, lambda: self.notify_hosts({host_id})
        )
