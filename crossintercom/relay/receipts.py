"""Receipts for this host's senders: taken from the wake-up hint when it carries them (no read),
else read from the store; passed to the waiting forward or, late, to the broker; consumed
(deleted) in batches off the delivery path (docs/storage.md, "Wake-ups")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Final

from crossintercom import protocol as p
from crossintercom.models import ACK_NOTE_CHARS, Outcome, Receipt
from crossintercom.relay.core import RelayCore
from crossintercom.relay.outbound import Outbound, receipt_of
from crossintercom.storage import ReceiptRow

READ_BATCH: Final = 500
# Handled receipts are deleted at each heartbeat (heartbeat_s) or as soon as this many wait.
CONSUME_BATCH: Final = 500


class Receipts:
    def __init__(self, relay: RelayCore, outbound: Outbound) -> None:
        self.relay = relay
        self.outbound = outbound
        # Ids passed on but not deleted yet, in order: a read that finds them again skips them.
        self._handled: dict[int, None] = {}
        self._consuming = asyncio.Lock()
        # When receipts last came (hinted or read): while they flow, hints are arriving and
        # the poll backstop has nothing to add.
        self.seen_at = -float("inf")

    def take(self, rows: Sequence[ReceiptRow]) -> None:
        """Pass on the receipts not passed on before (a hint and a read may both name one)."""
        relay, out = self.relay, self.outbound
        self.seen_at = time.monotonic()
        late: list[p.SenderReceipt] = []
        for row in rows:
            if row.id in self._handled:
                continue
            self._handled[row.id] = None
            key = (row.message_id, row.recipient_session)
            fut = out.receipt_waits.get(key)
            if (
                fut is not None
                and not fut.done()
                and row.sender_session is None
                and out.wait_hosts.get(key) == row.recipient_host
            ):
                # A delivery receipt a forward still waits for (late ones name their sender).
                fut.set_result(row)
                continue
            sender = row.sender_session or out.senders.get(row.message_id)
            if sender is not None:
                r = receipt_of(row)
                text = _note(row, r) or r.message
                late.append(
                    p.SenderReceipt(r.id, r.outcome, r.recipient, r.code, text, r.host, sender)
                )
        if late and relay.client is not None:
            relay.client.post(p.RemoteReceipt(late))
        if len(self._handled) >= CONSUME_BATCH:
            relay.spawn(self.consume())

    async def read(self) -> None:
        """The store's receipts for this host (a kind-only hint, a catch-up, the backstop)."""
        relay = self.relay
        if len(self._handled) >= CONSUME_BATCH:
            # Rows handled but not deleted would fill the read: delete them first. Short of
            # that the read skips them, and the heartbeat deletes them off the path (a delete
            # here would put a write, on SQLite an fsync, before every read).
            await self.consume()
        rows = await relay.store.receipts(
            relay.host,
            relay.generation,
            limit=READ_BATCH + len(self._handled),  # the handled ones are skipped
        )
        self.take(rows)

    async def consume(self) -> None:
        """Delete the handled receipts (kept for the next try when the store fails)."""
        async with self._consuming:
            ids = list(self._handled)
            if not ids:
                return
            relay = self.relay
            await relay.store.consume_receipts(relay.host, relay.generation, ids)
            for i in ids:
                self._handled.pop(i, None)


def _note(row: ReceiptRow, receipt: Receipt) -> str | None:
    """An ``acknowledged`` receipt's note, as the sender is told it (its ``message``). Another
    host wrote it: taken on that outcome only, at most the length a client may send (SQLite
    checks no length); the surfaces that show it neutralise it (crossintercom/safetext.py)."""
    if receipt.outcome is not Outcome.ACKNOWLEDGED or not isinstance(row.note, str):
        return None  # a SQLite file takes any type in any column
    return row.note[:ACK_NOTE_CHARS]
