"""``AsyncClient``: the Python API for asyncio programs (docs/delivery.md).

A client connects to the local broker (spawning it when needed), registers a session, saves
every incoming message to the session's durable inbox *before* acknowledging it
(``client/saving.py``), and retries ``send``/``ask``/``reply`` with one message id after
recoverable disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, Unpack

import msgspec

from crossintercom import protocol as p
from crossintercom.client.connection import BrokerConnection, expect
from crossintercom.client.identity import Identity, Marks, outgoing_body
from crossintercom.client.queries import Queries
from crossintercom.client.retries import (
    await_reply,
    reconnect_forever,
    with_retries,
)
from crossintercom.client.saving import Incoming, SavesDeliveries
from crossintercom.config import Settings
from crossintercom.errors import (
    Code,
    Disconnected,
    RemoteError,
    UsageError,
)
from crossintercom.inbox import Inbox
from crossintercom.inbox_faults import InboxFaults
from crossintercom.models import (
    Attachment,
    Message,
    Outcome,
    SendResult,
    SessionInfo,
)

MAX_ASK_TIMEOUT_S = 600.0


class AsyncClient(SavesDeliveries, Queries):
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
        # Connections made and registered, the first included (the relay's metrics).
        self.connects = 0
        # Frames of the broker <-> relay link, for a control client (the relay).
        self.on_frame: Callable[[p.ToRelayFrame], None] | None = None

    # --- connection ----------------------------------------------------------------------------

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
            self.connects += 1
            self.connected.set()

    def _drop_connection(self) -> p.FrameWriter | None:
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

    def _connect_for_reply(self) -> Awaitable[None] | None:
        """A client that does not reconnect by itself (a one-shot command) re-registers while
        it waits for an ask's reply, so a new broker can still hand it over."""
        if self._conn.open or self.reconnect or self._closed:
            return None
        return self._ensure_connected()

    def _report_faults(self) -> None:
        """Tell the broker what fails in the inbox now (nothing: it works again)."""
        if self.identity is not None:
            items = [
                p.InboxFaultItem(f.op, f.since, f.error[:500])
                for f in self.inbox_faults.current.values()
            ]
            self._conn.post(p.InboxFault(items))

    def post(self, frame: msgspec.Struct) -> bool:
        """Write a frame that expects no answer; False when not connected."""
        return self._conn.post(frame)

    async def close(self) -> None:
        self._closed = True
        # The writer is taken before the read task is cancelled: the read loop drops the
        # connection as it ends, and its writer would then be closed but never waited for, so a
        # TLS transport (a gateway's) would still be shutting down when the loop closes and
        # leave its socket open.
        writer = self._drop_connection()
        for task in (*self._reconnect_tasks, self._conn.read_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
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
