"""PostgreSQL's dialect of the store: psycopg 3's async connection under SQLAlchemy
(``pgdriver``), NOTIFY wake-ups, advisory locks, and the delivery path's operations (enqueue,
ack, receipts) as one statement each (``queries.PG_*``) in autocommit: one round trip and one
commit, the fence, the rows and the NOTIFY inside it (docs/perf-log/2026-12.md, "Store path
reshaped"). ``postgres_store`` makes the store.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from crossintercom.errors import Code, StoreError, StoreInDoubt
from crossintercom.models import State
from crossintercom.safetext import one_line
from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage.batches import refuse_too_large, stale_enqueue
from crossintercom.storage.engine import lock_timed_out
from crossintercom.storage.interface import (
    MIGRATION_LOCK,
    Ack,
    Chore,
    EnqueueResult,
    LateReceipt,
    OutboundItem,
    ReceiptRow,
    StoreSettings,
    StuckTransaction,
)
from crossintercom.storage.pgdriver import PgDriver
from crossintercom.storage.sqlstore import SqlStore, utcnow
from crossintercom.storage.tables import metadata
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import (
    ROSTER,
    ROSTER_CHANNEL,
    PostgresWaiter,
    channel_name,
)

_json = msgspec.json.Encoder()
# How long a roster publish waits on a session id another session is inserting (ms).
CLAIM_WAIT_MS = 200
# How long a reserve waits for another reserve of its project. Each holds the lock for a few
# statements; one held longer is a stuck session (or a host role holding it on purpose:
# docs/operations.md, "Per-host roles"), said so instead of waiting out the statement timeout.
PROJECT_LOCK_WAIT_S = 5.0


def postgres_store(
    parsed: StoreURL, *, pool_size: int = db.PG_POOL_SIZE, host_id: str | None = None
) -> SqlStore[PgDriver]:
    """The store at ``parsed``; ``host_id``: the relay's, named in its connections'
    ``application_name`` (pg_stat_activity, docs/operations.md)."""
    app_name = db.application_name("relay", host_id) if host_id is not None else None
    driver = PgDriver(parsed, pool_size=pool_size, app_name=app_name)
    return SqlStore(parsed, driver, Postgres(parsed, driver))


@dataclass
class PgEnqueue:
    """One ``queries.pg_enqueue`` run: its parameters (None when no item fits the size limit),
    the results known before it (``too_large``), and which items it carries."""

    items: Sequence[OutboundItem]
    generation: int | None
    results: list[EnqueueResult | None]
    fitting: list[int]
    params: dict[str, Any] | None

    def finish(self, rows: Sequence[Any]) -> list[int] | None:
        """Fill the results from the statement's rows; the positions to run again in a new
        statement (see ``Postgres.enqueue``), or None when the generation was stale."""
        if self.generation is not None and rows and not rows[0][1]:
            return None
        batch = [self.items[i] for i in self.fitting]
        return _pg_results(batch, rows, self.results, self.fitting)

    def done(self) -> list[EnqueueResult]:
        return [r for r in self.results if r is not None]


def plan_pg_enqueue(
    items: Sequence[OutboundItem], limits: StoreSettings, now: datetime, generation: int | None
) -> PgEnqueue:
    """The parameters of ``queries.pg_enqueue`` for ``items`` (those over the size limit are
    refused here); ``Postgres.enqueue`` runs it."""
    results, fitting = refuse_too_large(items, limits)
    if not fitting:
        return PgEnqueue(items, generation, results, fitting, None)
    batch = [items[i] for i in fitting]
    params = {
        "host_id": batch[0].sender_host,
        "generation": generation,
        "now": now,
        "expires": now + timedelta(seconds=limits.retention_s),
        "mids": [it.message_id for it in batch],
        "rhosts": [it.recipient_host for it in batch],
        "rsessions": [it.recipient_session for it in batch],
        "digests": [it.digest for it in batch],
        # One JSON array (queries.PG_ENQUEUE): a text[] of JSON texts costs the driver an
        # escape per quote of every payload.
        "payloads": _json.encode([it.payload for it in batch]).decode(),
        "sizes": [it.size for it in batch],
    }
    return PgEnqueue(items, generation, results, fitting, params)


def _pg_results(
    batch: Sequence[OutboundItem],
    rows: Sequence[Any],
    results: list[EnqueueResult | None],
    where: list[int],
) -> list[int]:
    """Fill ``results`` from ``pg_enqueue``'s rows; the positions to run again (see above)."""
    first_digest: dict[str, str] = {}
    first_of_pair: dict[tuple[str, str], int] = {}
    again: list[int] = []
    for k, (item, row) in enumerate(zip(batch, rows, strict=True)):
        _ord, _current, msg_new, old_digest, dlv_new, old_state, _woken = row
        key = (item.message_id, item.recipient_session)
        first_digest.setdefault(item.message_id, item.digest)
        digest = first_digest[item.message_id] if msg_new else old_digest
        if digest is None:
            # Not ours to see (another host's id under row-level security), or committed
            # while we waited: a new statement tells which.
            again.append(where[k])
            continue
        if digest != item.digest:
            code = Code.PAYLOAD_CONFLICT
            results[where[k]] = EnqueueResult(*key, State.REFUSED.value, False, code)
            continue
        first = first_of_pair.setdefault(key, k) == k
        if dlv_new and first:
            results[where[k]] = EnqueueResult(*key, State.QUEUED.value, True, None)
        elif old_state is not None or not first:
            results[where[k]] = EnqueueResult(*key, old_state or State.QUEUED.value, False, None)
        else:
            again.append(where[k])
    return again


def stuck_transaction(row: Sequence[Any]) -> StuckTransaction:
    pid, user, app, client, idle, tables, kind = row
    held = None if idle is None else float(idle)
    return StuckTransaction(int(pid), user, app or None, client, held, tuple(tables), kind)


def _insert_unless_waiting(
    conn: Connection, insert: Any, rows: Sequence[Mapping[str, Any]]
) -> set[str] | None:
    """The session ids ``insert`` claimed for ``rows`` (in a savepoint), or None when it waited
    out the transaction's lock timeout (and undid only that)."""
    try:
        with conn.begin_nested():
            return set(conn.execute(insert, rows).scalars())
    except DBAPIError as exc:
        if not lock_timed_out(exc):
            raise
    return None


class Postgres:
    """PostgreSQL's alternatives (``sqlstore.Dialect``)."""

    name = "postgresql"
    # fetch_inbound is a plain read in autocommit: no row locks, so no transaction id and no
    # WAL flush at its commit. The rows were never claimed (the generation fence makes this
    # relay their only reader); a row an ack or expiry is finishing right now is read as still
    # queued and handed over once more, which the recipient's inbox drops by id.
    fetch_in_autocommit = True
    arrays = True
    beat_in_one_statement = True
    read_settings_stmt = q.READ_SETTINGS

    def __init__(self, parsed: StoreURL, driver: PgDriver) -> None:
        self.parsed = parsed
        self.driver = driver

    # -- wake-ups: NOTIFY, delivered at commit --------------------------------------------

    def notify(self, conn: Connection, host_ids: Collection[str], kind: str) -> None:
        # Once per channel and kind per transaction (Postgres folds duplicates).
        every = kind == ROSTER
        channels = [ROSTER_CHANNEL] if every else sorted({channel_name(h) for h in host_ids})
        conn.execute(q.PG_NOTIFY, {"channels": channels, "kind": kind})

    def ring(self, host_ids: Collection[str], kind: str) -> None:
        """Nothing: the NOTIFY went with the commit."""

    async def notify_hosts(self, host_ids: Collection[str]) -> None:
        """A catch-up hint (an empty payload: look at everything)."""
        await self.driver.run(lambda c: self.notify(c, host_ids, ""))

    async def private_hints(self) -> bool:
        """Whether the store has per-host roles: then hints carry no rows, and a hint that
        does is not taken (any role may NOTIFY, docs/operations.md). Asked at each waiter."""
        found = await self.driver.run(lambda c: c.execute(q.PG_PRIVATE_HINTS).scalar(), retry=False)
        return bool(found)

    async def _trust_hints(self) -> bool:
        return not (await self.driver.row_security() or await self.private_hints())

    def waiter(self, store: SqlStore[Any], host_id: str) -> PostgresWaiter:
        """Made in a thread other than the store's loop's (the relay's watcher, a test's), which
        the questions below are handed to."""
        return PostgresWaiter(
            self.driver,
            host_id,
            lambda: self.driver.blocking(self.notify_hosts({host_id})),
            trust_hints=self.driver.blocking(self._trust_hints()),
        )

    # -- locks, rights, stuck sessions ----------------------------------------------------

    def claim_sessions(
        self, conn: Connection, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[set[str], set[str]]:
        """A row another session is inserting would wait for that transaction (the unique
        index) with this host's row locked, so a host role could stall the whole publish; it
        is left out after a short wait instead, and the others go in (docs/operations.md,
        "Per-host roles")."""
        insert = q.insert_roster(self.name)
        conn.execute(q.PG_SET_LOCK_TIMEOUT, {"ms": str(CLAIM_WAIT_MS)})
        claimed = _insert_unless_waiting(conn, insert, rows)
        if claimed is not None:
            return claimed, set()
        claimed, held = set(), set()
        conn.execute(q.PG_SET_LOCK_TIMEOUT, {"ms": str(CLAIM_WAIT_MS // 5)})
        for row in rows:
            one = _insert_unless_waiting(conn, insert, [row])
            if one is None:
                held.add(str(row["session_id"]))
            else:
                claimed |= one
        return claimed, held

    def lock_project(self, conn: Connection, project: str) -> None:
        # The bound stays for the rest of this short transaction (its row locks wait no longer).
        conn.execute(q.PG_SET_LOCK_TIMEOUT, {"ms": str(int(PROJECT_LOCK_WAIT_S * 1000))})
        try:
            conn.execute(q.PG_LOCK_PROJECT, {"project": project})
        except DBAPIError as exc:
            if not lock_timed_out(exc):
                raise
            raise StoreError(
                f"another session has held the reservations of project {one_line(project)!r} "
                f"for over {PROJECT_LOCK_WAIT_S:g} s (a stuck transaction, or a host holding "
                "the lock); nothing was reserved: try again"
            ) from None

    def can_read_archive(self, conn: Connection) -> bool:
        return bool(conn.execute(q.PG_ARCHIVE_READABLE).scalar())

    async def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        # The relay's heartbeat may hold a pooled connection, waiting behind the very lock
        # this names: asked on a connection of its own.
        rows: list[StuckTransaction] = await self.driver.aside(self.stuck_chore(idle_s).fn)
        return rows

    def stuck_chore(self, idle_s: float) -> Chore:
        params = {
            "idle_s": idle_s,
            "tables": sorted(metadata.tables),
            "key": q.PG_MIGRATION_LOCK_KEY,
            "migration": MIGRATION_LOCK,
        }
        return Chore(
            lambda c: [stuck_transaction(r) for r in c.execute(q.PG_STUCK_TRANSACTIONS, params)]
        )

    async def trust_warnings(self, store: SqlStore[Any]) -> list[str]:
        return []

    # -- the delivery path, one statement each --------------------------------------------

    async def enqueue(
        self, store: SqlStore[Any], items: Sequence[OutboundItem], generation: int | None
    ) -> list[EnqueueResult]:
        if not items:
            return []
        if await self.driver.row_security():
            # The deliveries policy looks the message up in the statement's snapshot, which
            # cannot see a message the same statement inserts: two statements and more, in a
            # transaction (docs/operations.md, "Trust model").
            return await self.driver.run(lambda c: store.enqueue_in(c, items, generation))
        run = plan_pg_enqueue(items, await store.cached_settings(), utcnow(), generation)
        params = run.params
        if params is None:
            return run.done()
        stmt = q.pg_enqueue(generation is not None)
        # Autocommit: one round trip; a connection lost after it was sent may have committed
        # it, so that is in doubt (driver.in_transaction), for the relay to settle.
        rows = await self.driver.run(
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
                retried = await self.driver.run(lambda c: store.enqueue_in(c, rest, generation))
            except StoreError as exc:
                raise StoreInDoubt(
                    f"part of an enqueue to the store {self.parsed.masked} was written and the "
                    f"rest failed ({exc.message}): read it back by id"
                ) from exc
            for i, r in zip(again, retried, strict=True):
                run.results[i] = r
        return run.done()

    async def ack(
        self, store: SqlStore[Any], host_id: str, generation: int, acks: Sequence[Ack]
    ) -> int:
        # The first ack of a row wins, as it would one by one; the rest change nothing.
        first: dict[tuple[str, str], Ack] = {}
        for a in acks:
            first.setdefault((a.message_id, a.recipient_session), a)
        if not first:
            return 0
        params = {
            "host_id": host_id,
            "generation": generation,
            "finished": utcnow(),
            # One JSON array of rows, not a text[] per column: the driver dumps a text[]
            # element by element in Python (docs/perf-log/2026-12.md, "The hand-over's Python
            # per message").
            "rows": _json.encode(
                [[a.message_id, a.recipient_session, a.outcome, a.code] for a in first.values()]
            ).decode(),
        }
        # Autocommit: one statement is atomic by itself, and repeating it after a lost
        # connection changes nothing (the rows are finished; their receipts were written).
        run = await self.driver.run(
            lambda c: c.execute(q.PG_ACK, params).one(), single_statement=True
        )
        return int(run[0])

    async def receipts(
        self, store: SqlStore[Any], host_id: str, generation: int, limit: int
    ) -> list[ReceiptRow]:
        params = {"host_id": host_id, "generation": generation, "limit": limit}
        return await self.driver.run(
            lambda c: [ReceiptRow(*r) for r in c.execute(q.LIST_RECEIPTS, params)],
            single_statement=True,
        )

    async def add_receipts(
        self, store: SqlStore[Any], host_id: str, generation: int, receipts: Sequence[LateReceipt]
    ) -> int:
        if not receipts:
            return 0
        rows = [
            (
                r.message_id,
                r.recipient_session,
                r.sender_host,
                r.sender_session,
                r.outcome,
                r.code,
                r.note,
            )
            for r in receipts
        ]
        params = {
            "host_id": host_id,
            "generation": generation,
            "created": utcnow(),
            "rows": _json.encode(rows).decode(),
        }
        # Autocommit, as ack; a repeat after a lost connection can write a notice twice, as
        # a retried transaction could (late.py), never a message.
        run = await self.driver.run(
            lambda c: c.execute(q.PG_ADD_RECEIPTS, params).one(), single_statement=True
        )
        return int(run[0])

    async def consume_receipts(
        self, store: SqlStore[Any], host_id: str, generation: int, receipt_ids: Sequence[int]
    ) -> None:
        params = {"host_id": host_id, "generation": generation, "ids": list(receipt_ids)}
        await self.driver.run(
            lambda c: c.execute(q.PG_CONSUME_RECEIPTS, params), single_statement=True
        )
