"""PostgreSQL backend: psycopg 3's async connection under SQLAlchemy (``pgdriver``), NOTIFY
wake-ups.

The operations on a delivery's path (enqueue, fetch, ack, receipts) are one statement each here
(``queries.PG_*``) in autocommit: one round trip and one commit, the fence, the rows and the
NOTIFY inside it (docs/perf-log/2026-12.md, "Store path reshaped").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Connection

from crossintercom.errors import StoreError, StoreInDoubt
from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage.batches import (
    ack_params,
    add_receipts_params,
    plan_pg_enqueue,
    stale_enqueue,
)
from crossintercom.storage.interface import (
    MIGRATION_LOCK,
    Ack,
    Chore,
    EnqueueResult,
    LateReceipt,
    OutboundItem,
    StoreSettings,
    StuckTransaction,
)
from crossintercom.storage.pgdriver import PgDriver
from crossintercom.storage.sqlstore import SqlMailboxStore, utcnow
from crossintercom.storage.tables import metadata
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import (
    ROSTER,
    ROSTER_CHANNEL,
    PostgresWaiter,
    channel_name,
)


def stuck_params(idle_s: float) -> dict[str, Any]:
    return {
        "idle_s": idle_s,
        "tables": sorted(metadata.tables),
        "key": q.PG_MIGRATION_LOCK_KEY,
        "migration": MIGRATION_LOCK,
    }


def stuck_transaction(row: Sequence[Any]) -> StuckTransaction:
    pid, user, app, client, idle, tables, kind = row
    held = None if idle is None else float(idle)
    return StuckTransaction(int(pid), user, app or None, client, held, tuple(tables), kind)


class PostgresStore(SqlMailboxStore):
    dialect = "postgresql"
    # fetch_inbound is a plain read in autocommit: no row locks, so no transaction id and no
    # WAL flush at its commit. The rows were never claimed (the generation fence makes this
    # relay their only reader); a row an ack or expiry is finishing right now is read as still
    # queued and handed over once more, which the recipient's inbox drops by id.
    skip_locked = False
    fetch_in_autocommit = True
    arrays = True
    driver: PgDriver

    def __init__(
        self, parsed: StoreURL, *, pool_size: int = db.PG_POOL_SIZE, host_id: str | None = None
    ) -> None:
        # Named after the relay's host in pg_stat_activity (docs/operations.md).
        self.app_name = db.application_name("relay", host_id) if host_id is not None else None
        super().__init__(parsed, PgDriver(parsed, pool_size=pool_size, app_name=self.app_name))

    def _notify_in_txn(self, conn: Connection, host_ids: Collection[str], kind: str) -> None:
        # Delivered at commit, once per channel and kind per transaction (Postgres folds
        # duplicates).
        channels = sorted({channel_name(host_id) for host_id in host_ids})
        conn.execute(q.PG_NOTIFY, {"channels": channels, "kind": kind})

    def _notify_roster_in_txn(self, conn: Connection) -> None:
        conn.execute(q.PG_NOTIFY, {"channels": [ROSTER_CHANNEL], "kind": ROSTER})

    async def notify_hosts(self, host_ids: Collection[str]) -> None:
        """A catch-up hint (an empty payload: look at everything)."""
        await self._run(lambda c: self._notify_in_txn(c, host_ids, ""))

    async def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        # The relay's heartbeat may hold a pooled connection, waiting behind the very lock
        # this names: asked on a connection of its own.
        rows: list[StuckTransaction] = await self.driver.aside(self.stuck_chore(idle_s).fn)
        return rows

    def stuck_chore(self, idle_s: float) -> Chore:
        params = stuck_params(idle_s)
        return Chore(
            lambda c: [stuck_transaction(r) for r in c.execute(q.PG_STUCK_TRANSACTIONS, params)]
        )

    async def private_hints(self) -> bool:
        """Whether the store has per-host roles: then hints carry no rows, and a hint that
        does is not taken (any role may NOTIFY, docs/operations.md). Asked at each waiter."""
        return bool(await self._run(lambda c: c.execute(q.PG_PRIVATE_HINTS).scalar(), retry=False))

    async def _trust_hints(self) -> bool:
        return not (await self.driver.row_security() or await self.private_hints())

    def waiter(self, host_id: str) -> PostgresWaiter:
        """Made in a thread other than the store's loop's (the relay's watcher, a test's), which
        the questions below are handed to."""
        return PostgresWaiter(
            self.parsed.libpq_conninfo(),
            host_id,
            lambda: self.driver.blocking(self.notify_hosts({host_id})),
            trust_hints=self.driver.blocking(self._trust_hints()),
        )

    # -- the delivery path, one statement each --------------------------------------------

    async def _settings(self) -> StoreSettings:
        found = self.fresh_settings()
        if found is None:
            found = await self._run(self._read_settings, single_statement=True)
        return found

    async def enqueue(
        self, items: Sequence[OutboundItem], *, generation: int | None = None
    ) -> list[EnqueueResult]:
        if not items:
            return []
        if await self.driver.row_security():
            # The deliveries policy looks the message up in the statement's snapshot, which
            # cannot see a message the same statement inserts: two statements and more, in a
            # transaction (docs/operations.md, "Trust model").
            return await self._run(lambda c: self._enqueue_in(c, items, generation))
        run = plan_pg_enqueue(items, await self._settings(), utcnow(), generation)
        params = run.params
        if params is None:
            return run.done()
        stmt = q.pg_enqueue(generation is not None)
        # Autocommit: one round trip; a connection lost after it was sent may have committed
        # it, so that is in doubt (driver.in_transaction), for the relay to settle.
        rows = await self._run(
            lambda c: c.execute(stmt, params).all(), single_statement=True, write=True
        )
        again = run.finish(rows)
        if again is None:
            raise stale_enqueue(items, generation)
        if again:
            # Items whose rows a concurrent transaction committed while the statement waited
            # on them (a retried in-doubt enqueue, two relays sending one id) are not in its
            # snapshot: the batch statements, each seeing the latest commits, answer them.
            # The statement above committed the rest, so a failure now leaves it in doubt.
            rest = [items[i] for i in again]
            try:
                retried = await self._run(lambda c: self._enqueue_in(c, rest, generation))
            except StoreError as exc:
                raise StoreInDoubt(
                    f"part of an enqueue to the store {self.url_masked} was written and the "
                    f"rest failed ({exc.message}): read it back by id"
                ) from exc
            for i, r in zip(again, retried, strict=True):
                run.results[i] = r
        return run.done()

    async def ack(self, host_id: str, generation: int, acks: Sequence[Ack]) -> int:
        params = ack_params(host_id, generation, acks, utcnow())
        if params is None:
            return 0
        # Autocommit: one statement is atomic by itself, and repeating it after a lost
        # connection changes nothing (the rows are finished; their receipts were written).
        run = await self._run(lambda c: c.execute(q.PG_ACK, params).one(), single_statement=True)
        return int(run[0])

    async def add_receipts(
        self, host_id: str, generation: int, receipts: Sequence[LateReceipt]
    ) -> int:
        params = add_receipts_params(host_id, generation, receipts, utcnow())
        if params is None:
            return 0
        # Autocommit, as ack; a repeat after a lost connection can write a notice twice, as
        # a retried transaction could (late.py), never a message.
        run = await self._run(
            lambda c: c.execute(q.PG_ADD_RECEIPTS, params).one(), single_statement=True
        )
        return int(run[0])

    async def consume_receipts(
        self, host_id: str, generation: int, receipt_ids: Sequence[int]
    ) -> None:
        if not receipt_ids:
            return
        params = {"host_id": host_id, "generation": generation, "ids": list(receipt_ids)}
        await self._run(lambda c: c.execute(q.PG_CONSUME_RECEIPTS, params), single_statement=True)
