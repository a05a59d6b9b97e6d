"""``Client``: the blocking API for scripts, an ``AsyncClient`` on a background event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future as ThreadFuture
from typing import Any, TypeVar

from crossintercom import protocol as p
from crossintercom.client.aio import AsyncClient
from crossintercom.client.identity import Identity
from crossintercom.client.saving import Incoming
from crossintercom.config import Settings
from crossintercom.errors import UsageError
from crossintercom.inbox import Inbox
from crossintercom.models import Attachment, Message, SendResult, SessionInfo

T = TypeVar("T")
# The name of a Client's loop thread (the tests count those left running).
CLIENT_THREAD = "crossintercom-client"


def _run_loop(loop: asyncio.AbstractEventLoop, made: list[AsyncClient]) -> None:
    """The loop thread: runs until stopped, then ends the client and closes the loop itself,
    so a client that was never closed (only collected) leaves no thread and no descriptor."""
    try:
        loop.run_forever()
    finally:
        with contextlib.suppress(Exception):
            for aio in made:
                loop.run_until_complete(aio.close())
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            # The threads of `to_thread` calls (spawning a broker) end too.
            loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def _stop_loop(loop: asyncio.AbstractEventLoop) -> None:
    with contextlib.suppress(RuntimeError):  # already closed
        loop.call_soon_threadsafe(loop.stop)


class Client:
    """Blocking wrapper: an event loop in a background thread runs an ``AsyncClient``."""

    def __init__(self, settings: Settings, identity: Identity | None = None, **kw: Any) -> None:
        self._loop = asyncio.new_event_loop()
        made: list[AsyncClient] = []
        # Neither the thread nor the finalizer holds the Client, so dropping it stops the loop.
        self._thread = threading.Thread(
            target=_run_loop, args=(self._loop, made), daemon=True, name=CLIENT_THREAD
        )
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop)
        try:
            self._async = self._call(self._make(settings, identity, kw))
        except BaseException:
            self._finalizer()
            self._thread.join(5)
            raise
        made.append(self._async)
        self._made = made
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
            box = self._views.inbox = Inbox.of(aio.settings, aio.identity.id)
        return box

    def connect(self) -> Client:
        self._call(self._async.connect())
        return self

    def __enter__(self) -> Client:
        try:
            return self.connect()
        except BaseException:
            # `with` calls __exit__ only after __enter__ returned.
            self.close()
            raise

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
            self._made.clear()
        self._finalizer()  # the loop thread closes the loop once it stops
        self._thread.join(5)

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

    def status(self) -> p.StatusReport:
        return self._call(self._async.status())

    def groups(self) -> list[p.Group]:
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
