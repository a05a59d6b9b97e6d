"""PostgreSQL backend: psycopg 3 under SQLAlchemy Core, NOTIFY wake-ups.

Its engine (pool, timeouts, keepalives) and error wording come from ``storage.engine``. The
operations on a delivery's path (enqueue, fetch, ack, receipts) are one statement each here
(``queries.PG_*``): one round trip and one commit, the fence, the rows and the NOTIFY inside
it (docs/performance.md, "Store path reshaped").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy import Connection

from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage.batches import (
    ack_params,
    add_receipts_params,
    enqueue_pg,
    stale_enqueue,
)
from crossintercom.storage.interface import (
    Ack,
    EnqueueResult,
    LateReceipt,
    OutboundItem,
    StuckTransaction,
)
from crossintercom.storage.pghot import PgHotPath, stuck_params, stuck_transaction
from crossintercom.storage.sqlstore import SqlMailboxStore, utcnow
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import (
    DELIVERIES,
    ROSTER,
    ROSTER_CHANNEL,
    PostgresWaiter,
    channel_name,
)


class PostgresStore(SqlMailboxStore):
    dialect = "postgresql"
    # fetch_inbound is a plain read in autocommit: no row locks, so no transaction id and no
    # WAL flush at its commit. The rows were never claimed (the generation fence makes this
    # relay their only reader); a row an ack or expiry is finishing right now is read as still
    # queued and handed over once more, which the recipient's inbox drops by id.
    skip_locked = False
    fetch_in_autocommit = True
    arrays = True

    def __init__(
        self, parsed: StoreURL, *, pool_size: int = db.POOL_SIZE, host_id: str | None = None
    ) -> None:
        # Named after the relay's host in pg_stat_activity (docs/operations.md).
        self.app_name = db.application_name("relay", host_id) if host_id is not None else None
        engine = db.store_engine(
            parsed,
            pool_size=pool_size,
            statement_timeout_ms=db.PG_STATEMENT_TIMEOUT_MS,
            app_name=self.app_name,
        )
        super().__init__(parsed, engine, deadline_s=db.PG_OPERATION_DEADLINE_S)
        # Whether row-level security applies to this store's role (a per-host role, `db
        # grant-host`): asked once, on the first enqueue.
        self._row_security: bool | None = None

    def _notify_in_txn(self, conn: Connection, host_ids: Collection[str], kind: str) -> None:
        # Delivered at commit, once per channel and kind per transaction (Postgres folds
        # duplicates).
        channels = sorted({channel_name(host_id) for host_id in host_ids})
        conn.execute(q.PG_NOTIFY, {"channels": channels, "kind": kind})

    def _notify_roster_in_txn(self, conn: Connection) -> None:
        conn.execute(q.PG_NOTIFY, {"channels": [ROSTER_CHANNEL], "kind": ROSTER})

    def notify_hosts(self, host_ids: Collection[str]) -> None:
        """A catch-up hint (an empty payload: look at everything)."""
        self._run(lambda c: self._notify_in_txn(c, host_ids, ""))

    def row_security(self) -> bool:
        """Whether row-level security applies to this store's role (a per-host role, `db
        grant-host`); asked once."""
        if self._row_security is None:
            found = self._run(lambda c: c.execute(q.PG_ROW_SECURITY).scalar(), retry=False)
            self._row_security = bool(found)
        return self._row_security

    def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        params = stuck_params(idle_s)
        rows = self._run(
            lambda c: c.execute(q.PG_STUCK_TRANSACTIONS, params).all(), single_statement=True
        )
        return [stuck_transaction(row) for row in rows]

    def private_hints(self) -> bool:
        """Whether the store has per-host roles: then hints carry no rows, and a hint that
        does is not taken (any role may NOTIFY, docs/operations.md). Asked at each waiter."""
        return bool(self._run(lambda c: c.execute(q.PG_PRIVATE_HINTS).scalar(), retry=False))

    def waiter(self, host_id: str) -> PostgresWaiter:
        return PostgresWaiter(
            self.parsed.libpq_conninfo(),
            host_id,
            lambda: self.notify_hosts({host_id}),
            trust_hints=not (self.row_security() or self.private_hints()),
        )

    def hot_path(self) -> PgHotPath:
        """The delivery path on its own async connection, on the caller's loop (pghot)."""
        return PgHotPath(self)

    # -- the delivery path, one statement each --------------------------------------------

    def enqueue(
        self, items: Sequence[OutboundItem], *, generation: int | None = None
    ) -> list[EnqueueResult]:
        if not items:
            return []

        def write(conn: Connection) -> list[EnqueueResult]:
            if self._row_security is None:
                self._row_security = bool(conn.execute(q.PG_ROW_SECURITY).scalar())
            if self._row_security:
                # The deliveries policy looks the message up in the statement's snapshot,
                # which cannot see a message the same statement inserts: two statements
                # and more here (docs/operations.md, "Trust model").
                return self._enqueue_in(conn, items, generation)
            done = enqueue_pg(conn, items, self._current_settings(conn), utcnow(), generation)
            if done is None:
                raise stale_enqueue(items, generation)
            results, woken = done
            self._notify(conn, woken, DELIVERIES)  # only rows the fallback wrote
            return results

        # In a transaction: the fallback's statements (rare) join the first one's, and an
        # in-doubt COMMIT is told apart from a failure before it (transaction.py).
        return self._run(write)

    def ack(self, host_id: str, generation: int, acks: Sequence[Ack]) -> int:
        params = ack_params(host_id, generation, acks, utcnow())
        if params is None:
            return 0
        # Autocommit: one statement is atomic by itself, and repeating it after a lost
        # connection changes nothing (the rows are finished; their receipts were written).
        run = self._run(lambda c: c.execute(q.PG_ACK, params).one(), single_statement=True)
        return int(run[0])

    def add_receipts(self, host_id: str, generation: int, receipts: Sequence[LateReceipt]) -> int:
        params = add_receipts_params(host_id, generation, receipts, utcnow())
        if params is None:
            return 0
        # Autocommit, as ack; a repeat after a lost connection can write a notice twice, as
        # a retried transaction could (late.py), never a message.
        run = self._run(lambda c: c.execute(q.PG_ADD_RECEIPTS, params).one(), single_statement=True)
        return int(run[0])

    def consume_receipts(self, host_id: str, generation: int, receipt_ids: Sequence[int]) -> None:
        if not receipt_ids:
            return
        params = {"host_id": host_id, "generation": generation, "ids": list(receipt_ids)}
        self._run(lambda c: c.execute(q.PG_CONSUME_RECEIPTS, params), single_statement=True)
