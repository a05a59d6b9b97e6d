"""Local delivery: push to a session's connection, wait for its ack, else queue durably.

Also the backlog a session gets when it (re)registers and the receipts shown to senders on
this host. Outcome rules are in ``outcomes``; this module does the waiting and writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Coroutine
from typing import Any

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import Code
from crossintercom.local_broker.delivery import outcomes
from crossintercom.local_broker.delivery.traffic import Traffic
from crossintercom.local_broker.sessions.conn import AckResult, Conn, Push
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state.store import BrokerState, QueuedItem
from crossintercom.models import REFUSAL_ADVICE, Message, Outcome, Receipt

log = logging.getLogger(__name__)
# How much of a backlog is handed over in one go (bytes of stored bodies): the connection holds
# that much for a client that reads it at its pace (docs/delivery.md).
DRAIN_PAGE_BYTES = 32 * 1024 * 1024


class Delivery:
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        state: BrokerState,
        *,
        retire: Callable[[Conn], None],
        spawn: Callable[[Coroutine[Any, Any, Any]], None],
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.state = state
        self._retire = retire
        self._spawn = spawn
        # ask id -> the connection waiting on it (the one-shot `ask`, or the listener).
        self.ask_waiters: dict[str, Conn] = {}
        self._acked_receipts: list[tuple[str, str, str]] = []
        self.traffic: Traffic | None = None  # told when a queued message reaches its session
        # The recipients' inbound policy (inbound_policy.py): a receipt ends the delivery.
        self.screen: Callable[[Message, str], Receipt | None] | None = None

    def forget_conn(self, conn: Conn) -> None:
        for ask_id in [a for a, c in self.ask_waiters.items() if c is conn]:
            del self.ask_waiters[ask_id]

    async def push(self, conn: Conn, msg: Message, *, reply: bool = False) -> Push | str:
        """Write a deliver frame and wait for the ack: ``Push.ACKED``, the ack's refusal code, or
        another ``Push`` (nothing reached the recipient's inbox)."""
        fut = conn.expect_ack(msg.id, self.settings.ack_timeout_s)
        if not conn.write(p.Deliver(msg, reply=reply)):
            self._retire(conn)
            return Push.CONNECTION_LOST
        # Drained only when the socket did not take the whole frame: a drain wrapped in a
        # timeout is a task and a loop turn of its own on every push (docs/performance.md).
        if conn.writer.transport.get_write_buffer_size():
            try:
                await asyncio.wait_for(conn.writer.drain(), self.settings.ack_timeout_s)
            except OSError:  # TimeoutError included: a client that stops reading cannot be written
                self._retire(conn)  # a write that fails retires the session at once
                return Push.CONNECTION_LOST
        # Resolved by the ack, or ``Push.TIMEOUT`` by the connection's sweep (no timer per
        # push: docs/perf-log/2026-12.md, "The hand-over's Python per message"); on a timeout the
        # session stays.
        code = await fut
        return Push.ACKED if code is None else code

    async def deliver(self, msg: Message, recipient: str, *, asker_host: str) -> Receipt:
        """Hand a message to a local session: delivered on its ack, else queued if durable."""
        try:
            refusal = None if msg.reply_to is None else self._may_name(msg, recipient)
        except sqlite3.Error as exc:
            return outcomes.storage_failed(msg.id, recipient, exc)
        if refusal is not None:
            return refusal
        if self.screen is not None and (screened := self.screen(msg, recipient)) is not None:
            return screened
        if msg.expects_reply:
            # Recorded before the push so a fast reply is authorised; dropped if nothing lands.
            try:
                self.state.add_pending(msg.id, recipient, msg.sender.id, asker_host, msg.to_dict())
            except sqlite3.Error as exc:
                log.error("cannot record the ask", extra={"id": msg.id, "error": str(exc)})
                return outcomes.storage_failed(msg.id, recipient, exc)
        owner = self.registry.owner(recipient)
        push = await self.push(owner, msg) if owner is not None else Push.OFFLINE
        receipt = outcomes.local_receipt(
            msg.id, recipient, push, durable=self.registry.is_durable(recipient)
        )
        try:
            if receipt.outcome is Outcome.QUEUED:
                self._queue(recipient, msg)
            elif receipt.outcome is not Outcome.DELIVERED and msg.expects_reply:
                self.state.drop_pending(msg.id, recipient)
        except sqlite3.Error as exc:
            log.error("cannot queue the message", extra={"id": msg.id, "error": str(exc)})
            return outcomes.storage_failed(msg.id, recipient, exc)
        return receipt

    def _may_name(self, msg: Message, recipient: str) -> Receipt | None:
        """A message naming an ask of its recipient in ``reply_to`` would be taken for its
        answer: only the session the ask went to may send one, and not once the ask is
        answered (the hand-over's rule for mail from other hosts, docs/delivery.md). None: it
        goes on, through the inbound policy."""
        assert msg.reply_to is not None
        if self.state.ask_owner(msg.reply_to) != recipient:
            return None
        if not self.state.may_answer(msg.reply_to, msg.sender.id):
            return _refused(msg.id, recipient, Code.REPLY_NOT_AUTHORISED)
        if self.state.answered(msg.reply_to):
            return _refused(msg.id, recipient, Code.ALREADY_REPLIED)
        return None

    async def route_reply(self, reply: Message, asker_id: str) -> Receipt:
        """The answer to an open ask: to the connection waiting on it, else the asker's
        session, else its queue. Passes no inbound policy (the asker asked for it), so it
        answers the ask once: any other reply naming it is ``already_replied``, from this host
        or another (docs/agents.md#inbound-policy)."""
        assert reply.reply_to is not None
        try:
            if not self.state.answer_ask(reply.reply_to, reply.id):
                return _refused(reply.id, asker_id, Code.ALREADY_REPLIED)
        except sqlite3.Error as exc:
            return outcomes.storage_failed(reply.id, asker_id, exc)
        receipt = await self._route_reply(reply, asker_id)
        if receipt.outcome in (Outcome.REFUSED, Outcome.NOT_SENT):
            with contextlib.suppress(sqlite3.Error):  # then it stays answered: never twice
                self.state.unanswer_ask(reply.reply_to, reply.id)
        return receipt

    async def _route_reply(self, reply: Message, asker_id: str) -> Receipt:
        assert reply.reply_to is not None
        waiter = self.ask_waiters.get(reply.reply_to)
        pushed = False
        if waiter is not None and not waiter.closed:
            pushed = await self.push(waiter, reply, reply=True) is Push.ACKED
            if pushed:
                self.ask_waiters.pop(reply.reply_to, None)
        owner = self.registry.owner(asker_id)
        if not pushed and owner is not None and owner is not waiter:
            pushed = await self.push(owner, reply, reply=True) is Push.ACKED
        durable = self.registry.is_durable(asker_id)
        receipt = outcomes.reply_receipt(reply.id, asker_id, pushed=pushed, durable=durable)
        if receipt.outcome is Outcome.QUEUED:
            try:
                self._queue(asker_id, reply)
            except sqlite3.Error as exc:
                log.error("cannot queue the reply", extra={"id": reply.id, "error": str(exc)})
                return outcomes.storage_failed(reply.id, asker_id, exc)
        return receipt

    def queue_unheld(self, recipient: str, msg: Message) -> None:
        """Mail an inbound policy held, let out of the hold: queued like mail kept while away."""
        self._queue(recipient, msg.with_flags("resumed"))

    def _queue(self, recipient: str, msg: Message) -> None:
        self.state.enqueue(recipient, "message", msg.id, msg.to_dict(), self.settings.retention_s)

    # --- resume ---------------------------------------------------------------------------------

    def drain_backlog(self, conn: Conn, session_id: str) -> None:
        items = self.state.backlog(session_id)
        if not items:
            return
        # Written synchronously, before anything else can run, so the backlog precedes any new
        # message in the stream; acks are awaited afterwards. The connection makes room for it
        # (else a backlog over its "not reading" bound dropped the client before it could read,
        # at every reconnect), a page of at most DRAIN_PAGE_BYTES at a time: the next page
        # once this one is acknowledged (only a backlog that large can be overtaken by new mail
        # at a page's end; docs/delivery.md).
        page: list[QueuedItem] = []
        size = 0
        for item in items:
            if page and size + item.size > DRAIN_PAGE_BYTES:
                break
            page.append(item)
            size += item.size
        conn.make_room(size + size // 4)  # the frames around each body
        waits: list[tuple[int, asyncio.Future[AckResult]]] = []
        for item in page:
            if item.kind == "receipt":
                # The key makes the client ack it, so it is dequeued (and stops holding up the
                # rest of the backlog); item_id is the key ``notify_sender`` queued it under.
                fut = conn.expect_ack(item.item_id)
                conn.write(p.Notice(item.item_id, Receipt.from_dict(item.body)))
            else:
                msg = Message.from_dict(item.body)
                flags = ["resumed"]
                if not self.registry.sender_online(msg.sender):
                    flags.append("sender_gone")
                fut = conn.expect_ack(msg.id)
                reply = (
                    msg.reply_to is not None and self.state.ask_owner(msg.reply_to) == session_id
                )
                conn.write(p.Deliver(msg.with_flags(*flags), reply=reply))
                if self.traffic is not None:
                    fut.add_done_callback(self.traffic.acked(msg, session_id))
            waits.append((item.seq, fut))
        more = len(page) < len(items)
        self._spawn(self._await_backlog(conn, session_id, waits, more))

    async def _await_backlog(
        self,
        conn: Conn,
        session_id: str,
        waits: list[tuple[int, asyncio.Future[AckResult]]],
        more: bool,
    ) -> None:
        saved = await self._acked(waits)
        conn.make_room(0)
        if not saved:
            return  # the rest stays queued; the next registration hands it over again
        if more and not conn.closed and self.registry.owner(session_id) is conn:
            self.drain_backlog(conn, session_id)

    async def _acked(self, waits: list[tuple[int, asyncio.Future[AckResult]]]) -> bool:
        """Dequeue what the client saved, in order; False at the first it did not."""
        for seq, fut in waits:
            try:
                code = await asyncio.wait_for(fut, self.settings.ack_timeout_s * 3)
            except TimeoutError:
                return False  # left queued; the next registration hands it over again
            if code in (Push.CONNECTION_LOST, Push.TIMEOUT):
                # Not known saved (a live push of the same id shares this future and timed
                # out): it stays queued, and the next registration hands it over again.
                return False
            if code == Code.SAVE_FAILED:
                # Not saved (the inbox cannot be written): it stays queued, and the client's
                # next registration is handed it again.
                return False
            self.state.dequeue(seq)
        return True

    # --- receipts for senders on this host ------------------------------------------------------

    def notify_sender(self, sender_id: str, receipt: Receipt) -> None:
        """A receipt for a sender on this host: shown live, or queued for its return."""
        self.notify_senders([(sender_id, receipt)])

    def notify_senders(self, receipts: list[tuple[str, Receipt]]) -> None:
        """``notify_sender`` for several receipts: queued in one transaction, pushed with one
        write per sender, dequeued together once acknowledged."""
        durable = [(s, r) for s, r in receipts if self.registry.is_durable(s)]
        if durable:
            # Queued first: a live push whose connection dies before the ack is not lost.
            self.state.enqueue_many(
                [(s, "receipt", r.key, r.to_dict()) for s, r in durable],
                self.settings.retention_s,
            )
        by_owner: dict[Conn, list[tuple[str, Receipt]]] = {}
        for sender_id, receipt in receipts:
            owner = self.registry.owner(sender_id)
            if owner is not None:
                by_owner.setdefault(owner, []).append((sender_id, receipt))
        for owner, items in by_owner.items():
            futs = [(s, r.key, owner.expect_ack(r.key)) for s, r in items]
            if owner.write_many([p.Notice(r.key, r) for _, r in items]):
                for sender_id, key, fut in futs:
                    if self.registry.is_durable(sender_id):
                        fut.add_done_callback(self._dequeue_on_ack(sender_id, key))

    def _dequeue_on_ack(
        self, sender_id: str, key: str
    ) -> Callable[[asyncio.Future[AckResult]], None]:
        def acked(fut: asyncio.Future[AckResult]) -> None:
            if not fut.cancelled() and fut.result() is None:
                self._acked_receipts.append((sender_id, "receipt", key))
                if len(self._acked_receipts) == 1:
                    asyncio.get_running_loop().call_soon(self._dequeue_acked)

        return acked

    def _dequeue_acked(self) -> None:
        """Every receipt acknowledged since the loop last turned, dequeued in one transaction.
        A failed write leaves them queued: the next registration hands them over again, and
        the client's inbox holds each receipt once."""
        items, self._acked_receipts = self._acked_receipts, []
        try:
            self.state.dequeue_items(items)
        except sqlite3.Error as exc:
            log.error("cannot dequeue acknowledged receipts: %s", exc, extra={"error": str(exc)})


def _refused(message_id: str, recipient: str, code: Code) -> Receipt:
    return Receipt(message_id, Outcome.REFUSED, recipient, code, REFUSAL_ADVICE[code])
