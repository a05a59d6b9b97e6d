"""The mailbox half of the store both backends share: messages, deliveries, receipts, expiry,
purge and settings, over the host half in ``hosts``. The backends differ in connections,
locking and wake-ups."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from crossintercom.storage import queries as q
from crossintercom.storage.batches import enqueue_batch, stale_enqueue
from crossintercom.storage.driver import Driver
from crossintercom.storage.interface import (
    DEFAULT_MAX_PAYLOAD_CHARS,
    Ack,
    Chore,
    EnqueueResult,
    InboundRow,
    LateReceipt,
    MessageRow,
    OutboundItem,
    ReceiptRow,
    StoreSettings,
    StuckTransaction,
)
from crossintercom.storage.reservations import SqlReservations
from crossintercom.storage.rowcheck import (
    inbound_query,
    inbound_row,
    receipt_row,
    settings_of,
    text_of,
)
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import DELIVERIES, RECEIPTS

log = logging.getLogger(__name__)

EXPIRE_BATCH = 1000
# Enqueue checks the size limit against a copy of the settings row at most this old: the row
# changes by operator action only, and reading it in every enqueue cost a round trip.
SETTINGS_TTL_S = 5.0


def utcnow() -> datetime:
    return datetime.now(UTC)


class SqlMailboxStore(SqlReservations):
    """``MailboxStore`` over a driver: the host half (``hosts``), path reservations
    (``reservations``) and the mailbox."""

    def __init__(self, parsed: StoreURL, driver: Driver) -> None:
        super().__init__(parsed, driver)
        self._settings_lock = threading.Lock()
        self._settings_cache: tuple[float, StoreSettings] | None = None

    async def trust_warnings(self) -> list[str]:
        return []

    # -- messages -------------------------------------------------------------------------

    async def enqueue(
        self, items: Sequence[OutboundItem], *, generation: int | None = None
    ) -> list[EnqueueResult]:
        """The whole batch in one transaction of a constant number of statements
        (``batches.enqueue_batch``) and one NOTIFY; fenced by ``generation`` when given."""
        woken: set[str] = set()

        def write(conn: Connection) -> list[EnqueueResult]:
            woken.clear()  # a retried attempt starts over
            return self._enqueue_in(conn, items, generation, woken)

        return await self._run(write, after=lambda: self._after_commit(woken, DELIVERIES))

    def _enqueue_in(
        self,
        conn: Connection,
        items: Sequence[OutboundItem],
        generation: int | None,
        woken: set[str] | None = None,
    ) -> list[EnqueueResult]:
        """The enqueue's statements inside the caller's transaction, NOTIFY included; the
        hosts to ring after the commit are added to ``woken``."""
        sender = items[0].sender_host if items else ""
        if generation is not None and items and not self._is_current(conn, sender, generation):
            raise stale_enqueue(items, generation)
        limits = self._current_settings(conn)
        results, hosts = enqueue_batch(conn, self.dialect, items, limits, utcnow())
        if woken is not None:
            woken.update(hosts)
        self._notify(conn, hosts, DELIVERIES)
        return results

    async def get_message(self, message_id: str) -> MessageRow | None:
        def read(conn: Connection) -> MessageRow | None:
            params = {"message_id": message_id}
            digest = conn.execute(q.MESSAGE_DIGEST, params).scalar()
            if digest is None:
                return None
            states = dict(conn.execute(q.MESSAGE_STATES, params).all())
            return MessageRow(message_id, digest, states)

        return await self._run(read)

    async def fetch_inbound(
        self,
        host_id: str,
        generation: int,
        *,
        limit: int = 500,
        session_ids: Collection[str] | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD_CHARS,
        skip_seqs: Collection[int] = (),
    ) -> list[InboundRow]:
        if session_ids is not None and not session_ids:
            return []
        stmt, params = inbound_query(
            host_id,
            generation,
            limit,
            session_ids,
            max_payload,
            self.skip_locked,
            self.arrays,
            raw_payload=self.dialect == "sqlite",
            skip_seqs=skip_seqs,
        )
        rows = await self._run(
            lambda c: c.execute(stmt, params).all(), single_statement=self.fetch_in_autocommit
        )
        return [inbound_row(*row, max_payload=max_payload) for row in rows]

    async def ack(self, host_id: str, generation: int, acks: Sequence[Ack]) -> int:
        """One UPDATE per distinct (outcome, code) in the batch (usually one), then one
        INSERT … SELECT of the receipts for exactly the rows it changed."""
        woken: set[str] = set()
        # The first ack of a row wins, as it would one by one; the rest change nothing. Rows
        # named by their seq (as read: the relay's acks, whatever a writer stored in their
        # keys) are finished by it, the others by their key.
        by_outcome: dict[tuple[str, str | None, bool], list[Any]] = {}
        seen: set[tuple[str, str] | int] = set()
        for a in acks:
            key = (a.message_id, a.recipient_session) if a.seq is None else a.seq
            if key not in seen:
                seen.add(key)
                by_outcome.setdefault((a.outcome, a.code, a.seq is not None), []).append(key)

        def write(conn: Connection) -> int:
            woken.clear()
            if not acks or not self._is_current(conn, host_id, generation):
                return 0
            now = utcnow()
            finished: list[int] = []
            for (outcome, code, by_seq), keys in by_outcome.items():
                params = {
                    "host_id": host_id,
                    "new_state": outcome,
                    "new_reason": code,
                    "finished": now,
                    **({"seqs": keys} if by_seq else q.key_params(self.dialect, keys)),
                }
                changed = conn.execute(q.finish_deliveries(self.dialect, by_seq), params)
                finished.extend(changed.scalars())
            if finished:
                self._write_receipts(conn, finished, now, woken)
            return len(finished)

        return await self._run(write, after=lambda: self._after_commit(woken, RECEIPTS))

    def _write_receipts(
        self, conn: Connection, seqs: list[int], now: datetime, woken: set[str]
    ) -> None:
        """Receipts for deliveries this transaction just finished; wakes their senders."""
        senders = conn.execute(
            q.receipts_for_finished(self.dialect), {"created": now, "seqs": seqs}
        )
        woken.update(h for h in map(text_of, senders.scalars()) if h is not None)
        self._notify(conn, woken, RECEIPTS)

    async def receipts(
        self, host_id: str, generation: int, *, limit: int = 500
    ) -> list[ReceiptRow]:
        params = {"host_id": host_id, "generation": generation, "limit": limit}
        if self.dialect != "sqlite":
            return await self._run(
                lambda c: [ReceiptRow(*r) for r in c.execute(q.LIST_RECEIPTS, params)],
                single_statement=True,
            )
        rows = await self._run(
            lambda c: c.execute(q.SQLITE_LIST_RECEIPTS, params).all(), single_statement=True
        )
        found = [(r[0], receipt_row(r)) for r in rows]
        bad = [rid for rid, row in found if row is None]
        if bad:
            # Never passed on, and deleted now: left, they would fill every later read.
            log.warning(
                "receipts for host %s dropped: a value is not UTF-8 (written by no relay; "
                'docs/operations.md, "Trust model")',
                host_id,
                extra={"ids": bad[:20]},
            )
            await self.consume_receipts(host_id, generation, bad)
        return [row for _, row in found if row is not None]

    async def consume_receipts(
        self, host_id: str, generation: int, receipt_ids: Sequence[int]
    ) -> None:
        if not receipt_ids:
            return
        params = {"host_id": host_id, "receipt_ids": list(receipt_ids)}

        def write(conn: Connection) -> None:
            if self._is_current(conn, host_id, generation):
                conn.execute(q.DELETE_RECEIPTS, params)

        await self._run(write)

    async def add_receipts(
        self, host_id: str, generation: int, receipts: Sequence[LateReceipt]
    ) -> int:
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            if not receipts or not self._is_current(conn, host_id, generation):
                return 0
            extra = {"recipient_host": host_id, "created": utcnow()}
            made = conn.execute(q.INSERT_LATE_RECEIPTS, [asdict(r) | extra for r in receipts])
            woken.update(r.sender_host for r in receipts)
            self._notify(conn, woken, RECEIPTS)
            return int(made.rowcount)

        return await self._run(write, after=lambda: self._after_commit(woken, RECEIPTS))

    async def forget_session(self, host_id: str, generation: int, session_id: str) -> int:
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            if not self._is_current(conn, host_id, generation):
                return 0
            now = utcnow()
            params = {"host_id": host_id, "session_id": session_id, "finished": now}
            keys = list(conn.execute(q.FORGET_DELIVERIES, params).scalars())
            forgotten = {"host_id": host_id, "session_id": session_id}
            conn.execute(q.DELETE_ROSTER_SESSION, forgotten)
            conn.execute(q.FORGET_RESERVATIONS, forgotten)
            conn.execute(q.BUMP_ROSTER_REV, {"host": host_id, "gen": generation})
            self._notify_roster_in_txn(conn)
            if keys:
                self._write_receipts(conn, keys, now, woken)
            return len(keys)

        def hints() -> None:
            self._after_commit(woken, RECEIPTS)
            self._after_roster_commit()

        return await self._run(write, after=hints)

    async def expire(self) -> int:
        total = 0
        while True:
            count = await self._expire_batch()
            total += count
            if count < EXPIRE_BATCH:
                return total

    async def _expire_batch(self) -> int:
        chore = self.expire_chore()
        count: int = await self._run(chore.fn, after=chore.after)
        return count

    def expire_chore(self) -> Chore:
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            now = utcnow()
            params = {"now": now, "finished": now, "limit": EXPIRE_BATCH}
            keys = list(conn.execute(q.EXPIRE_BATCH, params).scalars())
            if keys:
                self._write_receipts(conn, keys, now, woken)
            return len(keys)

        return Chore(write, lambda: self._after_commit(woken, RECEIPTS))

    async def purge(self, *, batch: int = 1000, older_than_s: float | None = None) -> int:
        """Delete finished deliveries (and then-orphaned messages) in bounded transactions.

        Finished rows are kept for ``older_than_s`` (default: the store's retention) because
        they are the dedup record a sender's retry of the same id is answered from.
        """
        keep = (await self.settings()).retention_s if older_than_s is None else older_than_s
        total = 0
        while True:
            found: tuple[int, int] = await self._run(self.purge_chore(keep, batch).fn)
            done, receipts = found
            total += done + receipts
            if done < batch and receipts < batch:
                return total

    def purge_chore(self, older_than_s: float, batch: int = 1000) -> Chore:
        def one_batch(conn: Connection) -> tuple[int, int]:
            params = {"cutoff": utcnow() - timedelta(seconds=older_than_s), "limit": batch}
            ids = conn.execute(q.purge_deliveries(self.dialect), params).scalars().all()
            # SQLite: as bytes (a writer's message id that is not UTF-8 failed every
            # purge); such a row's message is left, a row its writer can delete.
            texts = {t for t in map(text_of, ids) if t is not None}
            if texts:
                conn.execute(q.PURGE_ORPHAN_MESSAGES, {"message_ids": list(texts)})
            return len(ids), int(conn.execute(q.PURGE_RECEIPTS, params).rowcount)

        return Chore(one_batch)

    # -- settings -------------------------------------------------------------------------

    def _read_settings(self, conn: Connection) -> StoreSettings:
        sqlite = self.dialect == "sqlite"
        read = q.SQLITE_READ_SETTINGS if sqlite else q.READ_SETTINGS
        return self.remember_settings(conn.execute(read).one_or_none())

    def remember_settings(self, row: Sequence[Any] | None) -> StoreSettings:
        """The settings from a ``READ_SETTINGS`` row (none: the defaults), kept for reuse; a
        value that is not a whole number in its column's range (a writer of a SQLite file) is
        left at its default."""
        found, bad = settings_of(row)
        if bad:
            log.warning(
                "store settings %s are not whole numbers in range: their defaults are used "
                '(docs/operations.md, "Trust model")',
                ", ".join(bad),
            )
        with self._settings_lock:
            self._settings_cache = (time.monotonic(), found)
        return found

    def fresh_settings(self) -> StoreSettings | None:
        """The cached settings while younger than ``SETTINGS_TTL_S`` (another host's change
        is seen within that time), else None: read them again."""
        cached = self._settings_cache
        if cached is not None and time.monotonic() - cached[0] < SETTINGS_TTL_S:
            return cached[1]
        return None

    def _current_settings(self, conn: Connection) -> StoreSettings:
        """The settings, read through ``conn`` only when the cached copy is stale."""
        return self.fresh_settings() or self._read_settings(conn)

    async def settings(self) -> StoreSettings:
        return await self._run(self._read_settings, single_statement=True)

    async def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        return []  # SQLite: a held file lock shows as its writers' busy timeouts instead

    async def update_settings(
        self, *, max_message_bytes: int | None = None, retention_s: int | None = None
    ) -> None:
        """Change the store-wide limits (an operator action, not a relay one)."""
        values: dict[str, Any] = {}
        if max_message_bytes is not None:
            values["max_message_bytes"] = max_message_bytes
        if retention_s is not None:
            values["retention_s"] = retention_s
        if values:
            await self._run(lambda c: c.execute(q.update_settings(values)))
            with self._settings_lock:
                self._settings_cache = None  # this store sees its own change at once
