"""The mailbox half of the store both backends share: messages, deliveries, receipts, expiry,
purge and settings, over the host half in ``hosts``. The backends differ in connections,
locking and wake-ups."""

from __future__ import annotations

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
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import DELIVERIES, RECEIPTS

EXPIRE_BATCH = 1000
# Enqueue checks the size limit against a copy of the settings row at most this old: the row
# changes by operator action only, and reading it in every enqueue cost a round trip.
SETTINGS_TTL_S = 5.0


def utcnow() -> datetime:
    return datetime.now(UTC)


def inbound_query(
    host_id: str,
    generation: int,
    limit: int,
    session_ids: Collection[str] | None,
    max_payload: int,
    skip_locked: bool,
    arrays: bool,
    *,
    raw_payload: bool = False,
    skip_seqs: Collection[int] = (),
) -> tuple[Any, dict[str, Any]]:
    """``fetch_inbound``'s statement and parameters; ``raw_payload``: payloads read as bytes
    (SQLite, where a writer may store any bytes); ``skip_seqs``: rows the statement leaves
    out."""
    stmt = q.inbound(
        by_session=session_ids is not None,
        skip_locked=skip_locked,
        array=arrays,
        raw=raw_payload,
        skip=bool(skip_seqs),
    )
    params: dict[str, Any] = {
        "host_id": host_id,
        "generation": generation,
        "limit": limit,
        "max_payload": max_payload,
    }
    if session_ids is not None:
        params["session_ids"] = list(session_ids)
    if skip_seqs:
        params["skip_seqs"] = list(skip_seqs)
    return stmt, params


def inbound_row(
    seq: int,
    message_id: str,
    session: str,
    text: str | bytes | None,
    sender: str | bytes,
    length: int | None,
    stored_digest: str | bytes | None = None,
    *,
    max_payload: int,
) -> InboundRow:
    """One fetched row, its payload's text as stored: not decoded here (the relay decodes it
    into a message once, and hands the text itself over). Bytes (SQLite: payload, sender and
    digest) are checked to be UTF-8 row by row, so a row that is not stands alone (refused by
    the relay's screening; docs/storage.md, "Delivery states")."""
    sender_host, digest = _text(sender), _text(stored_digest)

    def bad(problem: str) -> InboundRow:
        return InboundRow(seq, message_id, session, None, sender_host or "?", problem, digest)

    if sender_host is None or (stored_digest is not None and digest is None):
        return bad("sender host or digest is not valid UTF-8")
    if text is None:
        return bad(f"payload of {length} characters is over the {max_payload} that can be read")
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as exc:
            return bad(f"payload is not valid UTF-8 (byte {exc.start})")
    return InboundRow(seq, message_id, session, text, sender_host, None, digest)


def _text(value: str | bytes | None) -> str | None:
    """A column read as its bytes (SQLite), as text; None when not UTF-8."""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


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
        # The first ack of a row wins, as it would one by one; the rest change nothing.
        by_outcome: dict[tuple[str, str | None], list[tuple[str, str]]] = {}
        seen: set[tuple[str, str]] = set()
        for a in acks:
            key = (a.message_id, a.recipient_session)
            if key not in seen:
                seen.add(key)
                by_outcome.setdefault((a.outcome, a.code), []).append(key)

        def write(conn: Connection) -> int:
            woken.clear()
            if not acks or not self._is_current(conn, host_id, generation):
                return 0
            now = utcnow()
            finished: list[tuple[str, str]] = []
            for (outcome, code), keys in by_outcome.items():
                params = {
                    "host_id": host_id,
                    "new_state": outcome,
                    "new_reason": code,
                    "finished": now,
                    **q.key_params(self.dialect, keys),
                }
                changed = conn.execute(q.finish_deliveries(self.dialect), params)
                finished.extend((mid, session) for mid, session in changed)
            if finished:
                self._write_receipts(conn, finished, now, woken)
            return len(finished)

        return await self._run(write, after=lambda: self._after_commit(woken, RECEIPTS))

    def _write_receipts(
        self, conn: Connection, keys: list[tuple[str, str]], now: datetime, woken: set[str]
    ) -> None:
        """Receipts for deliveries this transaction just finished; wakes their senders."""
        params = {"created": now, **q.key_params(self.dialect, keys)}
        senders = conn.execute(q.receipts_for_finished(self.dialect), params)
        woken.update(h for h in map(_text, senders.scalars()) if h is not None)
        self._notify(conn, woken, RECEIPTS)

    async def receipts(
        self, host_id: str, generation: int, *, limit: int = 500
    ) -> list[ReceiptRow]:
        params = {"host_id": host_id, "generation": generation, "limit": limit}
        return await self._run(
            lambda c: [ReceiptRow(*r) for r in c.execute(q.LIST_RECEIPTS, params)],
            single_statement=True,
        )

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
            conn.execute(q.INSERT_LATE_RECEIPTS, [asdict(r) | extra for r in receipts])
            woken.update(r.sender_host for r in receipts)
            self._notify(conn, woken, RECEIPTS)
            return len(receipts)

        return await self._run(write, after=lambda: self._after_commit(woken, RECEIPTS))

    async def forget_session(self, host_id: str, generation: int, session_id: str) -> int:
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            if not self._is_current(conn, host_id, generation):
                return 0
            now = utcnow()
            params = {"host_id": host_id, "session_id": session_id, "finished": now}
            keys = [(mid, sid) for mid, sid in conn.execute(q.FORGET_DELIVERIES, params)]
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
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            now = utcnow()
            params = {"now": now, "finished": now, "limit": EXPIRE_BATCH}
            keys = [(mid, session) for mid, session in conn.execute(q.EXPIRE_BATCH, params)]
            if keys:
                self._write_receipts(conn, keys, now, woken)
            return len(keys)

        return await self._run(write, after=lambda: self._after_commit(woken, RECEIPTS))

    async def purge(self, *, batch: int = 1000, older_than_s: float | None = None) -> int:
        """Delete finished deliveries (and then-orphaned messages) in bounded transactions.

        Finished rows are kept for ``older_than_s`` (default: the store's retention) because
        they are the dedup record a sender's retry of the same id is answered from.
        """
        keep = (await self.settings()).retention_s if older_than_s is None else older_than_s
        total = 0
        while True:
            params = {"cutoff": utcnow() - timedelta(seconds=keep), "limit": batch}

            def one_batch(conn: Connection, params: dict[str, Any] = params) -> tuple[int, int]:
                ids = conn.execute(q.PURGE_DELIVERIES, params).scalars().all()
                if ids:
                    conn.execute(q.PURGE_ORPHAN_MESSAGES, {"message_ids": list(set(ids))})
                return len(ids), conn.execute(q.PURGE_RECEIPTS, params).rowcount

            done, receipts = await self._run(one_batch)
            total += done + receipts
            if done < batch and receipts < batch:
                return total

    # -- settings -------------------------------------------------------------------------

    def _read_settings(self, conn: Connection) -> StoreSettings:
        return self.remember_settings(conn.execute(q.READ_SETTINGS).one_or_none())

    def remember_settings(self, row: Sequence[Any] | None) -> StoreSettings:
        """The settings from a ``READ_SETTINGS`` row (none: the defaults), kept for reuse."""
        found = StoreSettings(*row) if row is not None else StoreSettings()
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
