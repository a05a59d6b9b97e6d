"""Inbound: rows queued for this host are read by state in sequence order, handed to the
broker, and acknowledged in the store after the recipient's ack; receipts for this host's
senders are passed on and consumed (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict
from typing import Final

from crossintercom import protocol as p
from crossintercom.errors import Code, StoreError
from crossintercom.models import Message, Outcome
from crossintercom.relay.core import RelayCore
from crossintercom.relay.outbound import Outbound, receipt_of
from crossintercom.storage import Ack, InboundRow

log = logging.getLogger(__name__)

POLL_BACKSTOP_S: Final = 2.0
INBOUND_BATCH: Final = 500
# A row the recipient's broker answered for but could not hand over this many times is marked
# refused ("undeliverable") rather than retried forever.
MAX_HANDOVER_ATTEMPTS: Final = 5


class Inbound:
    def __init__(self, relay: RelayCore, outbound: Outbound) -> None:
        self.relay = relay
        self.outbound = outbound
        self.wake = asyncio.Event()
        self._failed_handovers: Counter[tuple[str, str]] = Counter()

    def watch_store(self, loop: asyncio.AbstractEventLoop) -> None:
        """Thread: block on the store's wake-up channel and poke the event loop."""
        relay = self.relay
        while not relay.stopping.is_set():
            try:
                with relay.store.waiter(relay.host) as waiter:
                    while not relay.stopping.is_set():
                        waiter.wait(POLL_BACKSTOP_S)
                        loop.call_soon_threadsafe(self.wake.set)
            except Exception as exc:
                log.warning("wake-up channel failed; reconnecting", extra={"error": str(exc)})
                loop.call_soon_threadsafe(self.wake.set)
                time.sleep(1.0)

    async def loop(self) -> None:
        while not self.relay.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), POLL_BACKSTOP_S)
            self.wake.clear()
            try:
                # Receipts for our senders and rows for our sessions are independent reads.
                await asyncio.gather(self._take_receipts(), self._fetch_all())
            except StoreError as exc:
                log.warning("store unreachable; retrying", extra={"error": exc.message})
                await asyncio.sleep(1.0)

    async def _fetch_all(self) -> None:
        while await self._fetch_once():
            pass

    async def _fetch_once(self) -> bool:
        """Hand one batch of inbound rows to the broker; True if a full batch was moved."""
        relay = self.relay
        local_ids = [s.id for s in relay.local_sessions]
        if not local_ids or relay.client is None or not relay.client.connected.is_set():
            return False
        rows = await relay.store_call(
            relay.store.fetch_inbound,
            relay.host,
            relay.generation,
            limit=INBOUND_BATCH,
            session_ids=local_ids,
        )
        if not rows:
            return False
        per_recipient: dict[str, list[InboundRow]] = defaultdict(list)
        for row in rows:
            per_recipient[row.recipient_session].append(row)
        parts = await asyncio.gather(*(self._hand_over(rs) for rs in per_recipient.values()))
        acks = [a for part in parts for a in part]
        if acks:
            await relay.store_call(relay.store.ack, relay.host, relay.generation, acks)
        return len(rows) == INBOUND_BATCH and len(acks) == len(rows)

    async def _hand_over(self, rows: list[InboundRow]) -> list[Ack]:
        """One recipient's rows, all in flight at once; acks for those that landed.

        The frames are written in row order and the broker pushes them to the recipient in the
        order it reads them, so pipelining keeps per-recipient order. A row that did not land
        (unknown, broker gone) stays queued and is handed over again next round; the
        recipient's inbox keys by message id, so that never shows it twice.
        """
        client = self.relay.client
        assert client is not None
        acks: list[Ack] = []
        sendable: list[tuple[InboundRow, Message]] = []
        for row in rows:
            try:
                sendable.append((row, Message.from_dict(row.payload)))
            except ValueError as exc:
                # A row no broker could read is refused once, not retried forever.
                log.warning(
                    "inbound row refused: bad payload",
                    extra={"id": row.message_id, "error": str(exc)},
                )
                acks.append(Ack(row.message_id, row.recipient_session, "refused", Code.BAD_MESSAGE))
        # The broker answers within its ack timeout; past that (a stuck broker) the row stays
        # queued and is handed over again next round instead of hanging this host's inbound.
        answer_wait = self.relay.settings.ack_timeout_s * 2 + 5.0
        answers = await asyncio.gather(
            *(
                asyncio.wait_for(
                    client.request(p.Inbound(0, msg, row.recipient_session)), answer_wait
                )
                for row, msg in sendable
            ),
            return_exceptions=True,
        )
        for (row, _), resp in zip(sendable, answers, strict=True):
            if isinstance(resp, BaseException) or not isinstance(resp, p.Result):
                why = {"id": row.message_id, "error": repr(resp)}
                log.warning("hand-over failed; the row stays queued", extra=why)
                continue
            outcome, code = resp.outcome, resp.code or Code.REFUSED
            key = (row.message_id, row.recipient_session)
            if outcome is Outcome.NOT_SENT:
                # Nothing was stored on this host (e.g. its disk is full): the row stays queued
                # in the store until it can be, however long that takes.
                why = {"id": row.message_id, "code": code, "error": resp.message or ""}
                log.warning("hand-over not possible yet; the row stays queued", extra=why)
                continue
            if outcome not in (Outcome.DELIVERED, Outcome.QUEUED, Outcome.REFUSED):
                # The broker answered but could not hand it over (the recipient never
                # acknowledged): retried next round, but not forever.
                self._failed_handovers[key] += 1
                if self._failed_handovers[key] < MAX_HANDOVER_ATTEMPTS:
                    continue
                outcome, code = Outcome.REFUSED, Code.UNDELIVERABLE
            self._failed_handovers.pop(key, None)
            if outcome is Outcome.DELIVERED:
                acks.append(Ack(row.message_id, row.recipient_session, "delivered"))
            elif outcome is Outcome.QUEUED:
                # Now in the recipient host's durable custody: done for the store.
                acks.append(Ack(row.message_id, row.recipient_session, "delivered", "queued"))
            else:
                acks.append(Ack(row.message_id, row.recipient_session, "refused", code))
        return acks

    async def _take_receipts(self) -> None:
        relay = self.relay
        rows = await relay.store_call(
            relay.store.receipts, relay.host, relay.generation, limit=INBOUND_BATCH
        )
        if not rows:
            return
        late: list[p.SenderReceipt] = []
        for row in rows:
            fut = self.outbound.receipt_waits.get((row.message_id, row.recipient_session))
            if fut is not None and not fut.done() and row.sender_session is None:
                # A delivery receipt a forward still waits for (late ones name their sender).
                fut.set_result(row)
                continue
            sender = row.sender_session or self.outbound.senders.get(row.message_id)
            if sender is not None:
                r = receipt_of(row)
                late.append(
                    p.SenderReceipt(r.id, r.outcome, r.recipient, r.code, r.message, r.host, sender)
                )
        if late and relay.client is not None:
            relay.client.post(p.RemoteReceipt(late))
        await relay.store_call(
            relay.store.consume_receipts, relay.host, relay.generation, [r.id for r in rows]
        )
