"""What this host owes other hosts after an ack: ``shown`` and ``acknowledged`` receipts (the
latter with its note), late ``expired`` ones, and a forgotten session's queued rows
(docs/agents.md#shown-receipts, #forget; docs/delivery.md#acknowledgement).

The broker hands them over without waiting; they are written in batches off the delivery
path. While the store is unreachable they wait here (bounded) and are written once it answers;
a relay restart loses what was still waiting (a notice, never a message).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Final

from crossintercom import protocol as p
from crossintercom.errors import StoreError
from crossintercom.models import ACK_NOTE_CHARS
from crossintercom.relay.core import RelayCore
from crossintercom.storage import LateReceipt

log = logging.getLogger(__name__)

# Receipts held while the store is unreachable; past this the oldest are dropped (logged).
MAX_WAITING: Final = 10_000
RETRY_S: Final = 1.0
# Receipts that come one per message (a `shown` per message shown) are gathered this long into
# one write: a notice a second later, at most one commit a second for a stream of them instead
# of one each (docs/performance.md).
LINGER_S: Final = 1.0


class LateReceipts:
    def __init__(self, relay: RelayCore) -> None:
        self.relay = relay
        self._receipts: deque[LateReceipt] = deque()
        self._forgotten: list[str] = []
        self._wake = asyncio.Event()

    def put(self, receipts: list[p.ReceiptFor]) -> None:
        for r in receipts:
            if len(self._receipts) >= MAX_WAITING:
                dropped = self._receipts.popleft()
                log.warning(
                    "late receipt dropped: too many waiting", extra={"id": dropped.message_id}
                )
            self._receipts.append(
                LateReceipt(
                    r.id,
                    r.recipient,
                    r.sender.host,
                    r.sender.id,
                    r.outcome,
                    r.code,
                    # Clients send no longer note; past the column's size one would fail the batch.
                    r.note[:ACK_NOTE_CHARS] if r.note else None,
                )
            )
        self._wake.set()

    def forget(self, session_id: str) -> None:
        self._forgotten.append(session_id)
        self._wake.set()

    async def loop(self) -> None:
        relay = self.relay
        while not relay.stopping.is_set():
            await self._wake.wait()
            if not self._forgotten and len(self._receipts) < MAX_WAITING // 10:
                await asyncio.sleep(LINGER_S)
            self._wake.clear()
            try:
                await self._flush()
            except StoreError as exc:
                log.warning("late receipts not written yet; retrying", extra={"error": exc.message})
                await asyncio.sleep(RETRY_S)
                self._wake.set()

    async def _flush(self) -> None:
        relay = self.relay
        while self._forgotten:
            sid = self._forgotten[0]
            n = await relay.store.forget_session(relay.host, relay.generation, sid)
            log.info("forgotten session expired in the store", extra={"session": sid, "rows": n})
            self._forgotten.pop(0)
        if not self._receipts:
            return
        batch = list(self._receipts)
        self._receipts.clear()
        try:
            await relay.store.add_receipts(relay.host, relay.generation, batch)
        except StoreError:
            self._receipts.extendleft(reversed(batch))  # kept in order for the next attempt
            raise
