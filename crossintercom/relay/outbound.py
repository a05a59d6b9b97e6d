"""Outbound: ``forward`` frames batched into one store transaction, then one receipt per
recipient (docs/delivery.md): ``delivered`` when the remote host acknowledged within
``remote_ack_wait``, else ``queued``; ``not_sent`` only when nothing was committed."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import tenacity

from crossintercom import protocol as p
from crossintercom.errors import Code, SchemaDamaged, StoreError, StoreFenced, StoreInDoubt
from crossintercom.models import Outcome, Receipt, State, outcome_for_state
from crossintercom.relay.core import RelayCore
from crossintercom.storage import EnqueueResult, InDoubtEnqueue, OutboundItem, ReceiptRow

log = logging.getLogger(__name__)

# A receipt from another host for a message we queued earlier is shown to the sender; we keep
# the sender of recent forwards to know whom to tell.
_SENDER_MEMORY: Final = 100_000


@dataclass
class _Forward:
    frame: p.Forward
    waits: dict[str, asyncio.Future[ReceiptRow]] = field(default_factory=dict)


@dataclass
class _Settling:
    """A forward's receipts as they come; answered once, when the last one is known."""

    fwd: _Forward
    receipts: dict[str, Receipt] = field(default_factory=dict)
    callbacks: dict[str, Callable[[asyncio.Future[ReceiptRow]], None]] = field(default_factory=dict)
    open: int = 0
    answered: bool = False

    def in_order(self) -> list[Receipt]:
        return [self.receipts[r.session] for r in self.fwd.frame.recipients]


class Outbound:
    def __init__(self, relay: RelayCore) -> None:
        self.relay = relay
        self._queue: asyncio.Queue[_Forward] = asyncio.Queue()
        # (message id, recipient) -> the forward waiting for that receipt.
        self.receipt_waits: dict[tuple[str, str], asyncio.Future[ReceiptRow]] = {}
        # The host each waited-for receipt must come from (a receipt naming another is ignored).
        self.wait_hosts: dict[tuple[str, str], str] = {}
        self.senders: OrderedDict[str, str] = OrderedDict()

    def put(self, frame: p.Forward) -> None:
        self._queue.put_nowait(_Forward(frame))

    async def loop(self) -> None:
        while True:
            first = await self._queue.get()
            batch = [first]
            # Group commit: whatever is already waiting goes in the same transaction, without
            # waiting for more when only one message is there.
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._forward_batch(batch)

    async def _forward_batch(self, batch: list[_Forward]) -> None:
        relay = self.relay
        items: list[OutboundItem] = []
        for fwd in batch:
            msg = fwd.frame.message
            self._remember_sender(msg.id, msg.sender.id)
            payload = msg.to_dict()
            for r in fwd.frame.recipients:
                key = (msg.id, r.session)
                fut = self.receipt_waits.get(key)
                if fut is None or fut.done():
                    fut = asyncio.get_running_loop().create_future()
                    self.receipt_waits[key] = fut
                self.wait_hosts[key] = r.host
                fwd.waits[r.session] = fut
                items.append(
                    OutboundItem(
                        message_id=msg.id,
                        sender_host=relay.host,
                        recipient_host=r.host,
                        recipient_session=r.session,
                        digest=msg.digest(),
                        payload=payload,
                        size=msg.size(),
                    )
                )
        try:
            results: Sequence[EnqueueResult | InDoubtEnqueue] = await relay.store.enqueue(
                items, generation=relay.generation
            )
        except StoreInDoubt:
            results = await self._resolve_in_doubt(items)
        except StoreFenced:
            # A newer relay owns this host id: this one writes nothing more, and stops.
            log.warning("enqueue refused: this relay was fenced out; nothing was sent")
            self._refuse_all(batch, "this relay was replaced by a newer one; nothing was sent")
            relay.fenced()
            return
        except StoreError as exc:
            ids = [fwd.frame.message.id for fwd in batch]
            log.warning(
                "enqueue of %d message(s) failed before commit: %s",
                len(ids),
                exc.message,
                extra={"ids": ",".join(ids)},
            )
            if isinstance(exc, SchemaDamaged):
                # Said without the store's file name: this text reaches agents' models.
                why = "the shared store is damaged (the relay's log says how); nothing was sent"
                self._refuse_all(batch, why, exc.code)
            else:
                self._refuse_all(batch, "the shared store is unreachable; nothing was sent")
            return
        self._settle_batch(batch, {(r.message_id, r.recipient_session): r for r in results})

    def _refuse_all(
        self, batch: list[_Forward], why: str, code: str = Code.STORE_UNAVAILABLE
    ) -> None:
        """``not_sent`` for every recipient of the batch: nothing of it was written."""
        for fwd in batch:
            msg_id = fwd.frame.message.id
            self._answer(
                fwd,
                [
                    Receipt(msg_id, Outcome.NOT_SENT, r.session, code, why)
                    for r in fwd.frame.recipients
                ],
            )

    async def _resolve_in_doubt(
        self, items: list[OutboundItem]
    ) -> list[EnqueueResult | InDoubtEnqueue]:
        """The commit's fate is unknown: settle it by enqueueing the same rows again.

        Reading the rows by id is not enough: the lost COMMIT may still be on its way to the
        server (held in a network buffer), so "no row yet" does not mean "never". Enqueue is
        idempotent, and its inserts wait on the uniqueness of the message id for the old
        transaction to end: if that commits, ours finds its rows; if it aborts, ours writes
        them. Either way the message is stored and the answer is definite, never ``not_sent``
        (docs/reliability.md). While the store stays unreachable the answer is ``unknown``.
        """
        relay = self.relay
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_exponential(multiplier=0.2, max=5),
            stop=tenacity.stop_after_delay(relay.settings.remote_ack_wait_s + 5),
            # Fenced: the rows cannot be written again, so the first commit's fate stays unknown.
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, StoreError) and not isinstance(e, StoreFenced)
            ),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    found: list[EnqueueResult | InDoubtEnqueue] = list(
                        await relay.store.enqueue(items, generation=relay.generation)
                    )
                    log.info(
                        "in-doubt commit settled by enqueueing again",
                        extra={"ids": sorted({it.message_id for it in items})[:10]},
                    )
                    return found
        except StoreError:
            pass
        return [InDoubtEnqueue(it.message_id, it.recipient_session, "in_doubt") for it in items]

    def _settle_batch(
        self,
        batch: list[_Forward],
        results: dict[tuple[str, str], EnqueueResult | InDoubtEnqueue],
    ) -> None:
        """Answer each forward as soon as its last receipt is known: at once for what the
        enqueue settled, else when the receipt arrives, and ``queued`` for what is still
        waiting at ``remote_ack_wait``. Callbacks on the waits and one timer for the batch, not
        a task, a shield and a timer per forward (docs/perf-log/2026-12.md, "Cross-host throughput:
        the cycle")."""
        loop = asyncio.get_running_loop()
        waiting: list[_Settling] = []
        for fwd in batch:
            msg_id = fwd.frame.message.id
            settling = _Settling(fwd)
            for r in fwd.frame.recipients:
                now = _receipt_now(msg_id, r.session, results.get((msg_id, r.session)))
                if now is not None:
                    settling.receipts[r.session] = now
                    self._unwait(msg_id, r.session)
                    continue
                settling.open += 1
                cb = functools.partial(self._arrived, settling, r.session)
                settling.callbacks[r.session] = cb
                fwd.waits[r.session].add_done_callback(cb)
            if settling.open:
                waiting.append(settling)
            else:
                self._answer(fwd, settling.in_order())
        if waiting:
            loop.call_later(self.relay.settings.remote_ack_wait_s, self._expire, waiting)

    def _arrived(self, settling: _Settling, sid: str, wait: asyncio.Future[ReceiptRow]) -> None:
        if settling.answered or wait.cancelled() or wait.exception() is not None:
            return
        msg_id = settling.fwd.frame.message.id
        settling.receipts[sid] = receipt_of(wait.result(), with_host=False)
        settling.callbacks.pop(sid, None)
        self._unwait(msg_id, sid)
        settling.open -= 1
        if settling.open == 0:
            settling.answered = True
            self._answer(settling.fwd, settling.in_order())

    def _expire(self, waiting: list[_Settling]) -> None:
        """``remote_ack_wait`` passed: what has no receipt yet is ``queued`` (the store keeps
        it; a later receipt reaches the sender as a late one)."""
        for settling in waiting:
            if settling.answered:
                continue
            settling.answered = True
            msg_id = settling.fwd.frame.message.id
            for sid, cb in settling.callbacks.items():
                settling.fwd.waits[sid].remove_done_callback(cb)
                settling.receipts[sid] = Receipt(msg_id, Outcome.QUEUED, sid)
                self._unwait(msg_id, sid)
            self._answer(settling.fwd, settling.in_order())

    def _unwait(self, msg_id: str, sid: str) -> None:
        self.receipt_waits.pop((msg_id, sid), None)
        self.wait_hosts.pop((msg_id, sid), None)

    def _answer(self, fwd: _Forward, receipts: list[Receipt]) -> None:
        self.relay.metrics.forwarded(receipts)
        if self.relay.client is not None:
            self.relay.client.post(p.ForwardResult(fwd.frame.fid, receipts))

    def _remember_sender(self, message_id: str, sender_id: str) -> None:
        self.senders[message_id] = sender_id
        while len(self.senders) > _SENDER_MEMORY:
            self.senders.popitem(last=False)


def _receipt_now(
    msg_id: str, sid: str, res: EnqueueResult | InDoubtEnqueue | None
) -> Receipt | None:
    """The receipt the enqueue's result already settles, or None: wait for the remote host."""
    if res is None or isinstance(res, InDoubtEnqueue):
        # Never not_sent here: a lost COMMIT may still land (see _resolve_in_doubt).
        return Receipt(
            msg_id,
            Outcome.UNKNOWN,
            sid,
            Code.STORE_IN_DOUBT,
            "the store connection dropped during commit",
        )
    if res.code is not None:
        outcome, code, text = outcome_for_state(State.REFUSED, res.code)
        return Receipt(msg_id, outcome, sid, code, text)
    if res.state != State.QUEUED.value:
        # A retry of a message whose row was already settled: the row's state answers.
        outcome, code, text = outcome_for_state(res.state, None)
        return Receipt(msg_id, outcome, sid, code, text)
    return None


def receipt_of(row: ReceiptRow, *, with_host: bool = True) -> Receipt:
    """A receipt row from the store, as the sender sees it (a late one names the host)."""
    outcome, code, text = outcome_for_state(row.outcome, row.code)
    host = row.recipient_host if with_host else None
    return Receipt(row.message_id, outcome, row.recipient_session, code, text, host)
