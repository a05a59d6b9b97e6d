"""The relay's archive writer: copies off the delivery path, in batches (docs/archive.md).

Copies arrive from the broker (``archive`` frames) after their senders had their outcomes. They
wait in a bounded in-memory queue and are written in batches by a task of the archiver's own,
on the store's driver (``store.archive``): nothing waits for that task, and a batch holds the
relay's statement connection no longer than the archive's statement and lock timeouts
(docs/archive.md), so a failing archive fails its batch alone and a slow one is cut short.
When the queue is full, or a batch fails, copies are dropped and counted in the log: the
archive is a record kept for people, never a part of the delivery contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from crossintercom import protocol as p
from crossintercom.errors import StoreError
from crossintercom.models import SessionInfo
from crossintercom.storage import ArchiveEntry, ArchiveRecipient, ArchiveStore, ReceiptUpdate

log = logging.getLogger(__name__)

QUEUE_LIMIT: Final = 10_000
BATCH: Final = 500
# How long a first copy waits for company before its batch is written.
BATCH_WINDOW_S: Final = 0.2
PURGE_EVERY_S: Final = 600.0


class Archiver:
    def __init__(self, archive: ArchiveStore, host: str) -> None:
        self.archive = archive
        self.host = host
        self.enabled = False
        self.dropped = 0
        self.written = 0
        self._queue: asyncio.Queue[ArchiveEntry | ReceiptUpdate] = asyncio.Queue(QUEUE_LIMIT)
        self._sessions: dict[str, SessionInfo] = {}

    def know(self, sessions: list[SessionInfo]) -> None:
        """Sessions whose names a copy's recipients are shown with."""
        self._sessions.update((s.id, s) for s in sessions)

    def put(self, frame: p.ArchiveCopy | p.ArchiveReceipts) -> None:
        """Take a copy or later receipts; never blocks, never raises. What this host may say
        is about its own sessions' messages and deliveries to its own sessions (the trust rule
        of docs/operations.md): a receipt about any other is left out."""
        if not self.enabled:
            return
        if isinstance(frame, p.ArchiveReceipts):
            for r in frame.receipts:
                self._put(ReceiptUpdate(r.id, r.recipient, self.host, r.outcome, r.code))
            return
        own = frame.message.sender.host == self.host
        recipients = tuple(
            ArchiveRecipient(
                r.recipient or "",
                r.host or self.host,
                r.outcome.value,
                _name(self._sessions.get(r.recipient or "")),
                r.code,
            )
            for r in frame.receipts
            if r.recipient and (own or (r.host or self.host) == self.host)
        )
        self._put(ArchiveEntry(frame.message, recipients, frame.wait_s if own else None))

    def _put(self, item: ArchiveEntry | ReceiptUpdate) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning("archive queue full; copies dropped", extra={"dropped": self.dropped})

    async def refresh(self) -> bool:
        """Re-read the store-wide setting; True when it changed."""
        try:
            settings = await self.archive.archive_settings()
        except StoreError as exc:
            log.warning("archive settings unreadable", extra={"error": exc.message})
            return False
        return self.settle(settings.enabled)

    def settle(self, enabled: bool) -> bool:
        """The setting as the relay's heartbeat read it; True when it changed."""
        changed = enabled != self.enabled
        self.enabled = enabled
        return changed

    async def loop(self, on_change: Callable[[bool], None]) -> None:
        """Write batches until cancelled; re-read the setting and purge now and then."""
        next_settings = 0.0
        next_purge = time.monotonic() + PURGE_EVERY_S
        while True:
            now = time.monotonic()
            if now >= next_settings:
                # Read once at start; afterwards the relay's heartbeat carries it (settle).
                next_settings = float("inf")
                if await self.refresh():
                    on_change(self.enabled)
            if now >= next_purge:  # also while off: old copies still go at their time
                next_purge = now + PURGE_EVERY_S
                with contextlib.suppress(StoreError):
                    await self.archive.purge_archive()
            batch = await self._take(timeout=max(0.05, min(next_purge - time.monotonic(), 5.0)))
            if not batch:
                continue
            try:
                await self.archive.archive(batch)
                self.written += len(batch)
            except StoreError as exc:
                self.dropped += len(batch)
                log.warning(
                    "archive write failed; copies dropped",
                    extra={"error": exc.message, "dropped": len(batch)},
                )
            except Exception:
                self.dropped += len(batch)
                log.exception("archive write failed; copies dropped")

    async def _take(self, timeout: float) -> list[ArchiveEntry | ReceiptUpdate]:
        try:
            first = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return []
        batch = [first]
        deadline = time.monotonic() + BATCH_WINDOW_S
        while len(batch) < BATCH:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), left))
            except TimeoutError:
                break
        return batch


def _name(info: SessionInfo | None) -> str | None:
    return info.name if info is not None else None
