"""``AsyncClient``: the Python API for asyncio programs (docs/delivery.md).

A client connects to the local broker (spawning it when needed), registers a session, saves
every incoming message to the session's durable inbox *before* acknowledging it, and retries
``send``/``ask``/``reply`` with one message id after recoverable disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Unpack

import msgspec

from crossintercom import protocol as p
from crossintercom.client.connection import BrokerConnection, expect
from crossintercom.client.identity import Identity, Marks, outgoing_body
from crossintercom.client.queries import Queries
from crossintercom.client.retries import (
    SAVE_RETRY_S,
    await_reply,
    reconnect_forever,
    with_retries,
)
from crossintercom.config import Settings
from crossintercom.errors import (
    Code,
    Disconnected,
    InboxUnavailable,
    RemoteError,
    UsageError,
)
from crossintercom.inbox import Inbox
from crossintercom.inbox_faults import InboxFaults
from crossintercom.models import (
    Attachment,
    Message,
    Outcome,
    Receipt,
    SendResult,
    SessionInfo,
)
from crossintercom.runtime import secure_file
from crossintercom.testhooks import crash_at

log = logging.getLogger(__name__)

MAX_ASK_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Incoming:
    """What a listener sees: a message (saved to the inbox) or a receipt notice."""

    kind: Literal["message", "receipt"]
    message: Message | None = None
    receipt: Receipt | None = None


class AsyncClient(Queries):
    def __init__(
        self,
        settings: Settings,
        identity: Identity | None = None,
        *,
        mode: Literal["own", "auto"] = "own",
        spawn: bool = True,
        reconnect: bool = True,
    ) -> None:
        self.settings = settings
        self.identity = identity
        self.mode = mode
        self.spawn = spawn
        self.reconnect = reconnect
        self.session: SessionInfo | None = None
        self.attached = False
        self.incoming: asyncio.Queue[Incoming] = asyncio.Queue()
        self._conn = BrokerConnection(settings, self._on_frame, self._on_lost)
        # Every reconnect under way: a connection lost again while one runs starts another
        # (the connect lock makes them take turns), and close cancels them all.
        self._reconnect_tasks: set[asyncio.Task[None]] = set()
        self._connect_lock = asyncio.Lock()
        self._ask_waiters: dict[str, asyncio.Future[Message]] = {}
        self._in_flight = 0
        self._closed = False
        self._inbox: Inbox | None = None
        # What fails in the inbox now; each change is told to the broker (`status` shows it).
        self.inbox_faults = InboxFaults()
        self.inbox_faults.on_change = self._report_faults
        self._save_retry: asyncio.TimerHandle | None = None
        self._to_save: list[p.Deliver | p.Notice] = []
        self.connected = asyncio.Event()
        # Frames of the broker <-> relay link, for a control client (the relay).
        self.on_frame: Callable[[p.ToRelayFrame], None] | None = None

    # --- connection ----------------------------------------------------------------------------

    @property
    def inbox(self) -> Inbox:
        if self._inbox is None:
            if self.identity is None:
                raise UsageError("this client has no session, so no inbox")
            self._inbox = Inbox.of(self.settings, self.identity.id, self.inbox_faults)
            secure_file(self.settings, self._inbox.path)
        return self._inbox

    async def connect(self) -> AsyncClient:
        await self._ensure_connected()
        return self

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _ensure_connected(self) -> None:
        if self._closed:
            raise Disconnected("the client is closed")
        async with self._connect_lock:
            if self._conn.open:
                return
            await self._conn.connect(spawn=self.spawn)
            if self.identity is not None:
                register = p.Register(
                    request_id=0,
                    protocol=p.PROTOCOL_VERSION,
                    session=self.identity,
                    mode=self.mode,
                    # Asks this client still waits on: after a broker restart their replies
                    # come back to this connection, not the session's owner.
                    awaiting=[a for a, w in self._ask_waiters.items() if not w.done()],
                )
                try:
                    resp = expect(await self._conn.request(register), p.Registered)
                except RemoteError:
                    self._drop_connection()
                    raise
                self.attached = resp.attached
                if resp.session is not None:
                    self.session = resp.session
                if self.inbox_faults.current:  # a new connection: the broker knows nothing yet
                    self._report_faults()
            self.connected.set()

    def _drop_connection(self) -> asyncio.StreamWriter | None:
        self.connected.clear()
        return self._conn.drop()

    def _on_lost(self) -> None:
        self.connected.clear()
        if self.reconnect and not self._closed and self.identity is not None:
            task = asyncio.get_running_loop().create_task(self._reconnect_forever())
            self._reconnect_tasks.add(task)
            task.add_done_callback(self._reconnect_tasks.discard)

    async def _reconnect_forever(self) -> None:
        await reconnect_forever(self._ensure_connected, lambda: self._closed)

    def _on_frame(self, frame: p.FromBroker) -> None:
        if isinstance(frame, p.Deliver):
            self._on_deliver(frame)
        elif isinstance(frame, p.Notice):
            if self.identity is None:  # no session, so no inbox to keep it in
                self._ack(frame.key)
                self.incoming.put_nowait(Incoming("receipt", receipt=frame.receipt))
            else:
                self._on_deliver(frame)
        elif isinstance(frame, p.ToRelayFrame) and self.on_frame is not None:
            self.on_frame(frame)

    def _on_deliver(self, frame: p.Deliver | p.Notice) -> None:
        # Saved in a group: every delivery and notice read before the loop turns shares one
        # inbox transaction, in arrival order, and their acks go out together after its commit.
        self._to_save.append(frame)
        if len(self._to_save) == 1:
            asyncio.get_running_loop().call_soon(self._save_delivered)

    def _save_delivered(self) -> None:
        frames, self._to_save = self._to_save, []
        if self._closed:
            return  # not saved, so not acknowledged: the broker keeps them (docs/delivery.md)
        batch = [self._entry(f) for f in frames]
        try:
            new = self.inbox.save_many([(item, waiter is not None) for item, waiter in batch])
        except (sqlite3.Error, OSError, InboxUnavailable) as exc:
            for item, _ in batch:
                if isinstance(item, Message):
                    self._save_failed(item, exc)
                else:  # not acknowledged: the broker keeps it queued for the next registration
                    log.error("cannot save a receipt to the inbox: %s", exc)
            return
        crash_at("after_save")  # saved before delivered: the acks follow the commit
        acks: list[p.Ack] = []
        shown: list[Incoming] = []
        for (item, waiter), fresh in zip(batch, new, strict=True):
            if isinstance(item, Receipt):
                acks.append(p.Ack(item.key))
                shown.append(Incoming("receipt", receipt=item))
            elif waiter is None and not fresh and (conflict := self._conflict(item)):
                # The id was reused for another payload after its dedup record was released
                # (or that cannot be told now): not saved, so not reported delivered.
                acks.append(p.Ack(item.id, conflict))
            else:
                acks.append(p.Ack(item.id))
                if waiter is not None:
                    waiter.set_result(item)
                elif fresh:  # one handed over again (after a crash or retry) is shown once
                    shown.append(Incoming("message", message=item))
        self._conn.post_many(acks)
        for incoming in shown:
            self.incoming.put_nowait(incoming)

    def _connect_for_reply(self) -> Awaitable[None] | None:
        """A client that does not reconnect by itself (a one-shot command) re-registers while
        it waits for an ask's reply, so a new broker can still hand it over."""
        if self._conn.open or self.reconnect or self._closed:
            return None
        return self._ensure_connected()

    def _conflict(self, msg: Message) -> str | None:
        """Why a message already held by id cannot be acknowledged as saved, if it cannot."""
        try:
            return Code.ID_CONFLICT if self.inbox.holds_other_payload(msg) else None
        except InboxUnavailable:
            self._hand_over_again()
            return Code.SAVE_FAILED

    def _report_faults(self) -> None:
        """Tell the broker what fails in the inbox now (nothing: it works again)."""
        if self.identity is not None:
            items = [
                p.InboxFaultItem(f.op, f.since, f.error[:500])
                for f in self.inbox_faults.current.values()
            ]
            self._conn.post(p.InboxFault(items))

    def _entry(
        self, frame: p.Deliver | p.Notice
    ) -> tuple[Message | Receipt, asyncio.Future[Message] | None]:
        """What a frame saves, and the ask waiting for it (a reply returned to its waiting ask
        is saved shown: a listener never shows it again)."""
        if isinstance(frame, p.Notice):
            return frame.receipt, None
        msg = frame.message
        waiter = self._ask_waiters.get(msg.reply_to) if msg.reply_to else None
        if waiter is not None and not waiter.done():
            return msg, waiter
        return (msg.with_flags("late") if frame.reply else msg), None

    def _save_failed(self, msg: Message, exc: BaseException) -> None:
        """The inbox cannot be written (full or read-only disk): not saved, so not delivered.
        The broker keeps it queued and hands it over again when this client registers anew,
        which it does after a pause: mail flows once the disk is writable (docs/delivery.md)."""
        log.error("cannot save message %s to the inbox: %s", msg.id, exc.__cause__ or exc)
        self._ack(msg.id, refused=Code.SAVE_FAILED)
        self._hand_over_again()

    def _hand_over_again(self) -> None:
        if self.reconnect and self._save_retry is None:
            self._save_retry = asyncio.get_running_loop().call_later(SAVE_RETRY_S, self._reregister)

    def _reregister(self) -> None:
        self._save_retry = None
        if not self._closed and self._conn.open:
            self._drop_connection()
            self._on_lost()

    def _ack(self, key: str, refused: str | None = None) -> None:
        self._conn.post(p.Ack(key, refused))

    def post(self, frame: msgspec.Struct) -> bool:
        """Write a frame that expects no answer; False when not connected."""
        return self._conn.post(frame)

    async def close(self) -> None:
        self._closed = True
        for task in (*self._reconnect_tasks, self._conn.read_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        writer = self._drop_connection()
        if writer is not None:
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        if self._inbox is not None:
            self._inbox.close()
            self._inbox = None

    # --- operations with one identity ------------------------------------------------------------

    async def _operation(self, frame: p.Send | p.Reply) -> SendResult:
        msg_id = frame.message.id
        if self._in_flight >= self.settings.max_in_flight:
            return SendResult.refused(
                msg_id,
                Code.OVER_CAPACITY,
                f"more than {self.settings.max_in_flight} operations in flight on this client",
            )
        self._in_flight += 1
        try:
            resp = await with_retries(
                msg_id, self._ensure_connected, lambda: self._conn.request(frame)
            )
        finally:
            self._in_flight -= 1
        if isinstance(resp, SendResult):  # no answer: nothing to confirm
            return resp
        result = expect(resp, p.Result).send_result()
        self._confirm(result.id)
        return result

    def _confirm(self, message_id: str) -> None:
        """Tell the broker we have the outcome, so its dedup record can go: with the next
        request's write, or alone after a moment (``BrokerConnection.post_later``)."""
        self._conn.post_later(p.Confirm([message_id]))

    async def send(
        self,
        to: str,
        text: str,
        attachments: Sequence[Attachment] = (),
        *,
        reply_to: str | None = None,
        message_id: str | None = None,
        subject: str | None = None,
        thread_id: str | None = None,
        **marks: Unpack[Marks],
    ) -> SendResult:
        body = outgoing_body(
            to,
            text,
            attachments,
            reply_to,
            False,
            message_id,
            subject=subject,
            thread_id=thread_id,
            **marks,
        )
        return await self._operation(p.Send(request_id=0, message=body))

    async def ask(
        self,
        to: str,
        text: str,
        attachments: Sequence[Attachment] = (),
        *,
        timeout: float = MAX_ASK_TIMEOUT_S,
        message_id: str | None = None,
        subject: str | None = None,
        thread_id: str | None = None,
        **marks: Unpack[Marks],
    ) -> SendResult:
        if not 0 < timeout <= MAX_ASK_TIMEOUT_S:
            raise UsageError(f"ask timeout must be between 0 and {MAX_ASK_TIMEOUT_S:.0f} seconds")
        body = outgoing_body(
            to,
            text,
            attachments,
            None,
            True,
            message_id,
            subject=subject,
            thread_id=thread_id,
            **marks,
        )
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._ask_waiters[body.id] = waiter
        try:
            result = await self._operation(p.Send(request_id=0, message=body, wait_s=timeout))
            if result.outcome not in (Outcome.DELIVERED, Outcome.QUEUED):
                return result
            try:
                reply = await await_reply(waiter, timeout, self._connect_for_reply)
            except TimeoutError:
                return result
            return msgspec.structs.replace(result, reply=reply)
        finally:
            self._ask_waiters.pop(body.id, None)

    async def reply(
        self,
        text: str,
        *,
        reply_to: str | None = None,
        attachments: Sequence[Attachment] = (),
        message_id: str | None = None,
        subject: str | None = None,
        **marks: Unpack[Marks],
    ) -> SendResult:
        body = outgoing_body(
            None, text, attachments, reply_to, False, message_id, subject=subject, **marks
        )
        return await self._operation(p.Reply(request_id=0, message=body))

    # --- queries --------------------------------------------------------------------------------

    async def request(self, frame: msgspec.Struct) -> p.BrokerFrame:
        """Any request frame (its ``request_id`` is set here); connects first if needed."""
        await self._ensure_connected()
        return await self._conn.request(frame)

    def drain_incoming(self) -> list[Incoming]:
        """Everything that arrived and was not taken yet, without waiting."""
        out: list[Incoming] = []
        while not self.incoming.empty():
            out.append(self.incoming.get_nowait())
        return out

    async def next_incoming(self, timeout: float | None = None) -> Incoming | None:
        try:
            return await asyncio.wait_for(self.incoming.get(), timeout)
        except TimeoutError:
            return None
