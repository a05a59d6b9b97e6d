"""The Python API: ``AsyncClient`` for asyncio services, ``Client`` for scripts.

A client connects to the local broker (spawning it when needed), registers a session, saves
every incoming message to the session's durable inbox *before* acknowledging it, and retries
``send``/``ask``/``reply`` with one message id after recoverable disconnects (DESIGN §5).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future as ThreadFuture
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import tenacity

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import (
    BrokerUnavailable,
    CrossintercomError,
    Disconnected,
    RemoteError,
    UsageError,
)
from crossintercom.inbox import Inbox
from crossintercom.local_broker.server import crash_at
from crossintercom.local_broker.spawn import ensure_broker
from crossintercom.models import (
    Attachment,
    Message,
    Outcome,
    SendResult,
    SessionInfo,
    durable_session_id,
    new_id,
    valid_name,
)
from crossintercom.runtime import check_socket_path, modes, secure_file

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_ASK_TIMEOUT_S = 600.0
OPERATION_DEADLINE_S = 660.0
RETRY_WAITS_S = (1.0, 2.0, 5.0)
RECONNECT_WAITS_S = (1.0, 2.0, 5.0, 10.0, 30.0)
_RECOVERABLE = (Disconnected, BrokerUnavailable)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a client registers as. ``named`` gives the durable mailbox `--as NAME` means."""

    id: str
    name: str | None = None
    cwd: str | None = None
    model: str | None = None
    status: str | None = None
    purpose: str = "agent"
    groups: tuple[str, ...] = ()
    durable: bool = False

    @classmethod
    def named(
        cls, settings: Settings, name: str, session_id: str | None = None, **kw: Any
    ) -> Identity:
        if not valid_name(name):
            raise UsageError(
                f"invalid name {name!r}: use letters, digits, '.', '_' or '-', starting with a "
                "letter or digit, at most 64 characters"
            )
        sid = session_id or durable_session_id(settings.host_id, name)
        return cls(id=sid, name=name, durable=True, cwd=kw.pop("cwd", os.getcwd()), **kw)

    @classmethod
    def ephemeral(cls, **kw: Any) -> Identity:
        return cls(id=new_id(), **kw)

    def frame(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "purpose": self.purpose, "durable": self.durable}
        for key in ("name", "cwd", "model", "status"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.groups:
            d["groups"] = list(self.groups)
        return d


@dataclass(frozen=True, slots=True)
class Incoming:
    """What a listener sees: a message (saved to the inbox) or a receipt notice."""

    kind: str  # 'message' or 'receipt'
    message: Message | None = None
    receipt: dict[str, Any] | None = None


class AttachmentTooLarge(UsageError):
    """An attachment is over the message size limit; nothing was sent."""

    code = "too_large"


def load_attachment(path: str, max_bytes: int) -> Attachment:
    """A file attachment, refused clearly when it is too big or unreadable."""
    fpath = Path(path)
    try:
        size = fpath.stat().st_size
        if size > max_bytes:
            raise AttachmentTooLarge(
                f"attachment {path} is {size} bytes; the message limit is {max_bytes} bytes; "
                "nothing was sent"
            )
        content = fpath.read_text(errors="strict")
    except UnicodeDecodeError:
        raise UsageError(f"attachment {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"cannot read attachment {path}: {exc.strerror}") from None
    return Attachment("file", fpath.name, content)


class AsyncClient:
    def __init__(
        self,
        settings: Settings,
        identity: Identity | None = None,
        *,
        mode: str = "own",
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
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task[None] | None = None
        self._reconnect_task: asyncio.Task[None] | None = None
        self._connect_lock = asyncio.Lock()
        self._next_rid = 1
        self._requests: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ask_waiters: dict[str, asyncio.Future[Message]] = {}
        self._in_flight = 0
        self._closed = False
        self._inbox: Inbox | None = None
        self.connected = asyncio.Event()
        self.on_frame: Callable[[dict[str, Any]], None] | None = None

    # --- connection ----------------------------------------------------------------------------

    @property
    def inbox(self) -> Inbox:
        if self._inbox is None:
            if self.identity is None:
                raise UsageError("this client has no session, so no inbox")
            self._inbox = Inbox(self.settings.inbox_dir, self.identity.id, modes(self.settings)[1])
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
            if self._writer is not None:
                return
            check_socket_path(self.settings.socket_path)
            if self.spawn:
                await asyncio.to_thread(ensure_broker, self.settings)
            try:
                reader, writer = await asyncio.open_unix_connection(
                    str(self.settings.socket_path), limit=self.settings.max_frame_bytes + 1024
                )
            except OSError as exc:
                raise BrokerUnavailable(
                    f"cannot reach the broker at {self.settings.socket_path}: {exc.strerror}"
                ) from None
            self._reader, self._writer = reader, writer
            self._read_task = asyncio.get_running_loop().create_task(self._read_loop(reader))
            if self.identity is not None:
                try:
                    resp = await self._request(
                        {
                            "type": "register",
                            "protocol": p.PROTOCOL_VERSION,
                            "session": self.identity.frame(),
                            "mode": self.mode,
                            # Asks this client still waits on: after a broker restart their
                            # replies come back to this connection, not the session's owner.
                            "awaiting": [a for a, w in self._ask_waiters.items() if not w.done()],
                        }
                    )
                except RemoteError:
                    self._drop_connection()
                    raise
                self.attached = bool(resp.get("attached"))
                if resp.get("session"):
                    self.session = SessionInfo.from_dict(resp["session"])
            self.connected.set()

    def _drop_connection(self) -> None:
        self.connected.clear()
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
        for fut in self._requests.values():
            if not fut.done():
                fut.set_exception(Disconnected("the connection to the broker was lost"))
        self._requests.clear()

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                body = await p.read_frame(reader, self.settings.max_frame_bytes)
                if body is None:
                    break
                self._on_frame(p.decode_any(body))
        except (asyncio.IncompleteReadError, ConnectionError, CrossintercomError):
            pass
        finally:
            if self._reader is reader:
                self._drop_connection()
                if self.reconnect and not self._closed and self.identity is not None:
                    self._reconnect_task = asyncio.get_running_loop().create_task(
                        self._reconnect_forever()
                    )

    async def _reconnect_forever(self) -> None:
        """1, 2, 5, 10, then every 30 s, until it works or the client closes."""
        waits = tenacity.wait_chain(*[tenacity.wait_fixed(w) for w in RECONNECT_WAITS_S])
        retrying = tenacity.AsyncRetrying(
            wait=waits,
            retry=tenacity.retry_if_exception_type(_RECOVERABLE),
            stop=tenacity.stop_never,
            reraise=True,
        )
        with contextlib.suppress(CrossintercomError):
            async for attempt in retrying:
                with attempt:
                    await self._ensure_connected()

    def _on_frame(self, frame: dict[str, Any]) -> None:
        ftype = frame.get("type")
        rid = frame.get("request_id")
        if ftype == "deliver":
            self._on_deliver(frame)
        elif ftype == "notice":
            self._on_notice(frame)
        elif isinstance(rid, int) and rid in self._requests:
            fut = self._requests.pop(rid)
            if fut.done():
                return
            if ftype == "error":
                fut.set_exception(RemoteError(str(frame.get("code")), str(frame.get("message"))))
            else:
                fut.set_result(frame)
        elif ftype == "error":
            log.warning("broker error: %s: %s", frame.get("code"), frame.get("message"))
        elif self.on_frame is not None:
            self.on_frame(frame)  # frames for a control client (the relay)
        # A response for a request we no longer wait for (a late answer) is dropped by design.

    def _on_deliver(self, frame: dict[str, Any]) -> None:
        try:
            msg = Message.from_dict(frame["message"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("broker delivered a malformed message: %s", exc)
            return
        waiter = self._ask_waiters.get(msg.reply_to) if msg.reply_to else None
        if waiter is not None and not waiter.done():
            # Returned to the waiting ask: saved, but never shown again by a listener.
            self.inbox.save(msg, shown=True)
            self._ack(msg.id)
            waiter.set_result(msg)
            return
        if frame.get("reply"):
            msg = msg.with_flags("late")
        new = self.inbox.save(msg)  # saved before delivered: the ack follows the commit
        crash_at("after_save")
        if not new and self.inbox.holds_other_payload(msg):
            # The id was reused for another payload after its dedup record was released: this
            # one is not saved, so it must not be reported delivered.
            self._ack(msg.id, refused="id_conflict")
            return
        self._ack(msg.id)
        if new:  # a message handed over again (after a crash or retry) is held and shown once
            self.incoming.put_nowait(Incoming("message", message=msg))

    def _on_notice(self, frame: dict[str, Any]) -> None:
        receipt = frame.get("receipt")
        if not isinstance(receipt, dict):
            return
        if self.identity is not None:
            self.inbox.save_receipt(receipt)
        key = frame.get("key")
        if isinstance(key, str):
            self._ack(key)
        self.incoming.put_nowait(Incoming("receipt", receipt=receipt))

    def _ack(self, message_id: str, refused: str | None = None) -> None:
        if self._writer is not None and not self._writer.is_closing():
            frame: dict[str, Any] = {"type": "ack", "id": message_id}
            if refused is not None:
                frame["refused"] = refused
            self._writer.write(p.encode(frame))

    async def _request(self, frame: dict[str, Any]) -> dict[str, Any]:
        writer = self._writer
        if writer is None or writer.is_closing():
            raise Disconnected("not connected to the broker", written=False)
        rid = self._next_rid
        self._next_rid += 1
        data = p.encode({**frame, "request_id": rid})
        if len(data) - p.HEADER.size > self.settings.max_frame_bytes:
            # The broker would drop the connection; retrying would end as a false `unknown`.
            raise RemoteError(
                "too_large",
                f"frame of {len(data) - p.HEADER.size} bytes exceeds the "
                f"{self.settings.max_frame_bytes}-byte limit; nothing was sent",
            )
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._requests[rid] = fut
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, OSError):
            self._requests.pop(rid, None)
            raise Disconnected("the connection to the broker was lost", written=False) from None
        return await fut

    def post(self, frame: dict[str, Any]) -> bool:
        """Write a frame that expects no answer; False when not connected."""
        if self._writer is None or self._writer.is_closing():
            return False
        self._writer.write(p.encode(frame))
        return True

    async def close(self) -> None:
        self._closed = True
        for task in (self._reconnect_task, self._read_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        writer = self._writer
        self._drop_connection()
        if writer is not None:
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        if self._inbox is not None:
            self._inbox.close()
            self._inbox = None

    # --- operations with one identity ------------------------------------------------------------

    async def _operation(self, frame: dict[str, Any]) -> SendResult:
        msg_id = frame["message"]["id"]
        if self._in_flight >= self.settings.max_in_flight:
            return SendResult(
                msg_id,
                Outcome.REFUSED,
                "over_capacity",
                f"more than {self.settings.max_in_flight} operations in flight on this client",
            )
        self._in_flight += 1
        maybe_sent = False
        try:
            retrying = tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(1 + len(RETRY_WAITS_S))
                | tenacity.stop_after_delay(OPERATION_DEADLINE_S),
                wait=tenacity.wait_chain(*[tenacity.wait_fixed(w) for w in RETRY_WAITS_S]),
                retry=tenacity.retry_if_exception_type(_RECOVERABLE),
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        await self._ensure_connected()
                        try:
                            resp = await asyncio.wait_for(
                                self._request(frame), OPERATION_DEADLINE_S
                            )
                        except Disconnected as exc:
                            # Lost before the frame was written: that attempt sent nothing.
                            maybe_sent = maybe_sent or exc.details.get("written", True)
                            raise
            except _RECOVERABLE as exc:
                if maybe_sent:
                    return SendResult(msg_id, Outcome.UNKNOWN, "disconnected", str(exc))
                return SendResult(msg_id, Outcome.NOT_SENT, "broker_unavailable", exc.message)
            except TimeoutError:
                return SendResult(msg_id, Outcome.UNKNOWN, "deadline", "no outcome within 11 min")
            except RemoteError as exc:
                return SendResult(msg_id, Outcome.REFUSED, exc.code, exc.message)
        finally:
            self._in_flight -= 1
        result = SendResult.from_dict(resp)
        self._confirm(result.id)
        return result

    def _confirm(self, message_id: str) -> None:
        """Tell the broker we have the outcome, so its dedup record can go at once."""
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(p.encode({"type": "confirm", "ids": [message_id]}))

    @staticmethod
    def _body(
        to: str | None,
        text: str,
        attachments: Sequence[Attachment],
        reply_to: str | None,
        expects_reply: bool,
        message_id: str | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": message_id or new_id(),
            "message": text,
            "attachments": [a.to_dict() for a in attachments],
            "expects_reply": expects_reply,
        }
        if to is not None:
            body["to"] = to
        if reply_to is not None:
            body["reply_to"] = reply_to
        return body

    async def send(
        self,
        to: str,
        text: str,
        attachments: Sequence[Attachment] = (),
        *,
        reply_to: str | None = None,
        message_id: str | None = None,
    ) -> SendResult:
        body = self._body(to, text, attachments, reply_to, False, message_id)
        return await self._operation({"type": "send", "message": body})

    async def ask(
        self,
        to: str,
        text: str,
        attachments: Sequence[Attachment] = (),
        *,
        timeout: float = MAX_ASK_TIMEOUT_S,
        message_id: str | None = None,
    ) -> SendResult:
        if not 0 < timeout <= MAX_ASK_TIMEOUT_S:
            raise UsageError(f"ask timeout must be between 0 and {MAX_ASK_TIMEOUT_S:.0f} seconds")
        body = self._body(to, text, attachments, None, True, message_id)
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._ask_waiters[body["id"]] = waiter
        try:
            result = await self._operation({"type": "send", "message": body})
            if result.outcome not in (Outcome.DELIVERED, Outcome.QUEUED):
                return result
            try:
                reply = await self._await_reply(waiter, timeout)
            except TimeoutError:
                return result
            return replace(result, reply=reply)
        finally:
            self._ask_waiters.pop(body["id"], None)

    async def _await_reply(self, waiter: asyncio.Future[Message], timeout: float) -> Message:
        """Wait for an ask's reply. A client that does not reconnect by itself (a one-shot
        command) re-registers here when the broker goes away, so the new broker can still hand
        it the reply (live, or from the queue) instead of the ask waiting out its timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not waiter.done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError
            pause = 0.5
            if self._writer is None and not self.reconnect and not self._closed:
                try:
                    await asyncio.wait_for(self._ensure_connected(), remaining)
                except CrossintercomError:
                    pause = 1.0  # no broker yet: try again shortly
            await asyncio.wait({waiter}, timeout=min(pause, max(0.0, deadline - loop.time())))
        return waiter.result()

    async def reply(
        self,
        text: str,
        *,
        reply_to: str | None = None,
        attachments: Sequence[Attachment] = (),
        message_id: str | None = None,
    ) -> SendResult:
        body = self._body(None, text, attachments, reply_to, False, message_id)
        return await self._operation({"type": "reply", "message": body})

    # --- queries --------------------------------------------------------------------------------

    async def query(self, frame: dict[str, Any]) -> dict[str, Any]:
        await self._ensure_connected()
        return await self._request(frame)

    async def list_sessions(self) -> list[SessionInfo]:
        resp = await self.query({"type": "list"})
        return [SessionInfo.from_dict(s) for s in resp["sessions"]]

    async def status(self) -> dict[str, Any]:
        return await self.query({"type": "status"})

    async def groups(self) -> list[dict[str, Any]]:
        return list((await self.query({"type": "groups"}))["groups"])

    async def pending(self) -> list[Message]:
        resp = await self.query({"type": "pending"})
        return [Message.from_dict(m) for m in resp["messages"]]

    async def join(self, group: str) -> list[str]:
        return list((await self.query({"type": "join", "group": group}))["groups"])

    async def leave(self, group: str) -> list[str]:
        return list((await self.query({"type": "leave", "group": group}))["groups"])

    async def set_status(self, status: str | None) -> None:
        await self.query({"type": "set_status", "status": status})

    async def next_incoming(self, timeout: float | None = None) -> Incoming | None:
        try:
            return await asyncio.wait_for(self.incoming.get(), timeout)
        except TimeoutError:
            return None


class Client:
    """Blocking wrapper: an event loop in a background thread runs an ``AsyncClient``."""

    def __init__(self, settings: Settings, identity: Identity | None = None, **kw: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="crossintercom-client"
        )
        self._thread.start()
        self._async = self._call(self._make(settings, identity, kw))
        # Each calling thread gets its own view of the inbox: an SQLite connection is bound to
        # the thread that opened it, and the loop thread keeps its own for saving deliveries.
        self._views = threading.local()

    @staticmethod
    async def _make(
        settings: Settings, identity: Identity | None, kw: dict[str, Any]
    ) -> AsyncClient:
        return AsyncClient(settings, identity, **kw)

    def _call(self, coro: Awaitable[T]) -> T:
        fut: ThreadFuture[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return fut.result()

    @property
    def aio(self) -> AsyncClient:
        return self._async

    @property
    def inbox(self) -> Inbox:
        """The session's inbox, opened for the calling thread."""
        box: Inbox | None = getattr(self._views, "inbox", None)
        if box is None:
            aio = self._async
            if aio.identity is None:
                raise UsageError("this client has no session, so no inbox")
            box = self._views.inbox = Inbox(
                aio.settings.inbox_dir, aio.identity.id, modes(aio.settings)[1]
            )
        return box

    def connect(self) -> Client:
        self._call(self._async.connect())
        return self

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        box: Inbox | None = getattr(self._views, "inbox", None)
        if box is not None:
            box.close()
            self._views.inbox = None
        with contextlib.suppress(Exception):
            self._call(self._async.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def send(
        self, to: str, text: str, attachments: Sequence[Attachment] = (), **kw: Any
    ) -> SendResult:
        return self._call(self._async.send(to, text, attachments, **kw))

    def ask(
        self, to: str, text: str, attachments: Sequence[Attachment] = (), **kw: Any
    ) -> SendResult:
        return self._call(self._async.ask(to, text, attachments, **kw))

    def reply(self, text: str, **kw: Any) -> SendResult:
        return self._call(self._async.reply(text, **kw))

    def list_sessions(self) -> list[SessionInfo]:
        return self._call(self._async.list_sessions())

    def status(self) -> dict[str, Any]:
        return self._call(self._async.status())

    def groups(self) -> list[dict[str, Any]]:
        return self._call(self._async.groups())

    def pending(self) -> list[Message]:
        return self._call(self._async.pending())

    def join(self, group: str) -> list[str]:
        return self._call(self._async.join(group))

    def leave(self, group: str) -> list[str]:
        return self._call(self._async.leave(group))

    def set_status(self, status: str | None) -> None:
        self._call(self._async.set_status(status))

    def next_incoming(self, timeout: float | None = None) -> Incoming | None:
        return self._call(self._async.next_incoming(timeout))

    def run(self, fn: Callable[[AsyncClient], Awaitable[T]]) -> T:
        return self._call(fn(self._async))


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
