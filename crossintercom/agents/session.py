"""One agent's durable session, held by whichever surface runs (MCP server, wait, line monitor).

Several surfaces may want NAME's session at once: the MCP server for the harness's lifetime, a
``wait`` hook between turns, a line monitor. Each connects in ``auto`` mode: the first one owns
the session and receives its mail (saving it to the inbox file every surface reads); the others
attach and send as it (docs/agents.md#one-session-several-surfaces). An attached holder that
outlives the owner takes the session over (``own`` mode) so mail keeps arriving instead of
queueing. Registering as owner
pulls the mail queued while NAME was away into the inbox; a ``ping`` round trip after it proves
the backlog is saved, since the broker writes the backlog before it reads the next frame.

Display is shown-once across surfaces: every surface takes the session's show lock, reads the
unshown messages, writes them out, and only then marks shown what it wrote (a hand-over to a
model may hold fewer than it was given: docs/agents.md#shown-once, #one-hand-over).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from crossintercom import protocol as p
from crossintercom.client import AsyncClient, Identity, shown_frame
from crossintercom.config import Settings
from crossintercom.errors import Code, CrossintercomError, InboxUnavailable, RemoteError
from crossintercom.inbox import Entry, Inbox, trouble
from crossintercom.models import PRIORITY_RANK, Message, WakePolicy
from crossintercom.runtime import (
    ensure_runtime_dir,
    ensure_subdir,
    group_gid,
    modes,
    open_file,
    secure_file,
)

log = logging.getLogger(__name__)

# Writes a hand-over of the unseen messages it is given; returns those it showed, oldest first.
Writer = Callable[[list[Entry]], list[Entry]]

# How often an attached holder tries to take over a session whose owner has gone.
TAKEOVER_EVERY_S = 2.0
# Backstop for a missed file-change event (network filesystems, a dropped inotify event).
POLL_BACKSTOP_S = 1.0
# The wake policy is read from the broker at most this often (another process may change it).
WAKE_POLICY_TTL_S = 1.0


class Busy(CrossintercomError):
    """Another waiter already waits for this session's mail."""

    code = Code.WAITER_BUSY


def agents_dir(settings: Settings) -> Path:
    """``$CROSSINTERCOM_HOME/agents``: locks and escalation records, with the runtime modes."""
    settings.home.mkdir(mode=modes(settings)[0], parents=True, exist_ok=True)
    return ensure_subdir(settings, settings.home / "agents")


@contextlib.contextmanager
def _flock(path: Path, settings: Settings, *, blocking: bool) -> Iterator[None]:
    fd = open_file(path, os.O_RDWR | os.O_CREAT, modes(settings)[1], gid=group_gid(settings))
    secure_file(settings, path)
    try:
        flags = fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            raise Busy(f"another waiter holds {path.name}") from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def show_lock(settings: Settings, session_id: str) -> contextlib.AbstractContextManager[None]:
    """Held while a surface reads, writes out and marks messages: one surface shows each."""
    return _flock(agents_dir(settings) / f"{session_id}.show.lock", settings, blocking=True)


def wait_lock(settings: Settings, session_id: str) -> contextlib.AbstractContextManager[None]:
    """One waiter per name at a time; a second one gets ``Busy`` at once."""
    return _flock(agents_dir(settings) / f"{session_id}.wait.lock", settings, blocking=False)


def unseen(box: Inbox) -> list[Entry]:
    """Messages saved but never shown, most urgent first, then oldest first (receipts are
    notices, not mail; docs/delivery.md#priority)."""
    return by_priority([e for e in box.unshown() if e.kind == "message"])


def priority_rank(body: dict[str, Any]) -> int:
    """A message body's priority as a rank (an unknown word counts as ``normal``)."""
    return PRIORITY_RANK.get(str(body.get("priority") or "normal"), PRIORITY_RANK["normal"])


def by_priority(entries: list[Entry]) -> list[Entry]:
    """Most urgent first; the sort is stable, so arrival order holds within a priority."""
    return sorted(entries, key=lambda e: -priority_rank(e.body))


def wakes(entries: list[Entry], policy: WakePolicy) -> bool:
    """Whether unseen ``entries`` wake the session under ``policy`` (docs/agents.md#wake-policy):
    ``every`` message, only ``asks`` (messages waiting for an answer), only ``urgent`` ones, or
    ``never``."""
    if policy == "every":
        return bool(entries)
    if policy == "asks":
        return any(e.body.get("expects_reply") for e in entries)
    if policy == "urgent":
        return any(e.body.get("priority") == "urgent" for e in entries)
    return False


def show_unseen(
    settings: Settings,
    box: Inbox,
    session_id: str,
    write: Writer,
    *,
    limit: int | None = None,
    shown: Callable[[list[Entry]], object] | None = None,
) -> list[Entry]:
    """Hand unseen messages to ``write`` and mark shown what it showed, once it returned.

    ``write`` must have written and flushed its output (or built its result) by then, and
    returns the entries it showed: only those are marked, the others stay unseen (a
    hand-over's budget, docs/agents.md#one-hand-over). If it raises, nothing is marked.
    ``shown`` then gets what was shown (to send the senders their ``shown`` receipts).
    """
    with show_lock(settings, session_id):
        entries = unseen(box)[:limit] if limit is not None else unseen(box)
        if entries:
            entries = write(entries)
            box.mark_shown([e.seq for e in entries])
    if entries and shown is not None:
        shown(entries)
    return entries


class _InboxChanged(FileSystemEventHandler):
    def __init__(self, prefix: str, notify: Callable[[], None]) -> None:
        self.prefix = prefix
        self.notify = notify

    def on_any_event(self, event: FileSystemEvent) -> None:
        if os.path.basename(str(event.src_path)).startswith(self.prefix):
            self.notify()


class AgentSession:
    """NAME's session for one surface: connected in ``auto`` mode, taking over when orphaned."""

    def __init__(self, settings: Settings, identity: Identity, *, watch: bool = True) -> None:
        self.settings = settings
        self.identity = identity
        self.watch = watch  # False for a one-shot look: no watcher, no takeover
        self.client = self._new_client("auto")
        self.changed = asyncio.Event()  # set when the inbox may hold something new
        self._tasks: list[asyncio.Task[Any]] = []
        self._observer: Any = None
        self._busy_ops = 0
        self._wake: tuple[float, WakePolicy] | None = None

    def _new_client(self, mode: Literal["own", "auto"]) -> AsyncClient:
        return AsyncClient(self.settings, self.identity, mode=mode, reconnect=True)

    @property
    def name(self) -> str:
        return self.identity.name or self.identity.id

    @property
    def inbox(self) -> Inbox:
        return self.client.inbox

    def inbox_trouble(self) -> InboxUnavailable | None:
        """Why NAME's inbox fails now (a full or read-only file), after trying again what
        failed; None when it works (docs/reliability.md)."""
        return trouble(lambda: self.inbox)

    async def start(self) -> AgentSession:
        ensure_runtime_dir(self.settings)
        await self.client.connect()
        await self.sync()
        if not self.watch:
            return self
        loop = asyncio.get_running_loop()
        self._watch_inbox(loop)
        self._tasks.append(loop.create_task(self._drain_incoming(self.client)))
        self._tasks.append(loop.create_task(self._take_over_when_orphaned()))
        self._tasks.append(loop.create_task(self._backstop()))
        return self

    async def sync(self) -> None:
        """Return once every message the broker had for this session is in the inbox."""
        await self.client.request(p.Ping(0))

    @property
    def owner(self) -> bool:
        return not self.client.attached

    def report_shown(self, shown: list[Entry] | list[Message]) -> None:
        """``shown`` receipts for their senders: a notice, skipped while the broker is away."""
        frame = shown_frame(m.body if isinstance(m, Entry) else m.to_dict() for m in shown)
        if frame is not None:
            self.client.post(frame)

    def show(self, write: Writer, *, limit: int | None = None) -> list[Entry]:
        """``show_unseen`` on this session's inbox, then the ``shown`` report."""
        return show_unseen(
            self.settings,
            self.inbox,
            self.identity.id,
            write,
            limit=limit,
            shown=self.report_shown,
        )

    async def wake_policy(self) -> WakePolicy:
        """The session's wake policy as the broker holds it (re-read at most every second)."""
        loop = asyncio.get_running_loop()
        if self._wake is not None and loop.time() - self._wake[0] < WAKE_POLICY_TTL_S:
            return self._wake[1]
        policy: WakePolicy = self.client.session.wake if self.client.session else "every"
        with contextlib.suppress(CrossintercomError):
            for s in await self.client.list_sessions():
                if s.id == self.identity.id and s.host == self.settings.host_id:
                    policy = s.wake
        self._wake = (loop.time(), policy)
        return policy

    def note_wake(self, policy: WakePolicy) -> None:
        """This process just set the policy: no need to ask the broker for it."""
        self._wake = (asyncio.get_running_loop().time(), policy)

    async def woken(self) -> bool:
        """Unseen mail that wakes the session under its policy is there."""
        pending = unseen(self.inbox)
        return bool(pending) and wakes(pending, await self.wake_policy())

    def _watch_inbox(self, loop: asyncio.AbstractEventLoop) -> None:
        def notify() -> None:
            loop.call_soon_threadsafe(self.changed.set)

        observer = Observer()
        observer.schedule(_InboxChanged(self.identity.id, notify), str(self.settings.inbox_dir))
        observer.daemon = True
        observer.start()
        self._observer = observer

    async def _drain_incoming(self, client: AsyncClient) -> None:
        while True:
            await client.incoming.get()
            self.changed.set()

    async def _backstop(self) -> None:
        while True:
            await asyncio.sleep(POLL_BACKSTOP_S)
            self.changed.set()

    async def _take_over_when_orphaned(self) -> None:
        """While attached, try now and then to own the session; the broker refuses
        (``session_in_use``) for as long as the owner lives, so this only wins once it left."""
        while True:
            await asyncio.sleep(TAKEOVER_EVERY_S)
            if not self.client.attached:
                continue
            fresh = self._new_client("own")
            try:
                await fresh.connect()
            except RemoteError as exc:
                await fresh.close()
                if exc.code != Code.SESSION_IN_USE:
                    log.warning("session takeover failed: %s", exc.message)
                continue
            except CrossintercomError:
                await fresh.close()
                continue
            old, self.client = self.client, fresh
            self._tasks.append(asyncio.get_running_loop().create_task(self._drain_incoming(fresh)))
            await self.sync()
            self.changed.set()
            self._tasks.append(asyncio.get_running_loop().create_task(self._retire(old)))

    async def _retire(self, old: AsyncClient) -> None:
        # An operation still running on the old connection (an ask waiting for its reply)
        # finishes there first; its reply is routed to the connection that asked.
        while self._busy_ops:
            await asyncio.sleep(0.2)
        await old.close()

    @contextlib.asynccontextmanager
    async def operation(self) -> AsyncIterator[AsyncClient]:
        """The client to run one operation on, kept open until the operation ends."""
        self._busy_ops += 1
        try:
            yield self.client
        finally:
            self._busy_ops -= 1

    async def wait_changed(self, timeout: float) -> bool:
        """Wait until the inbox may have changed, or ``timeout``; True if it may have."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            return False
        self.changed.clear()
        return True

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._observer is not None:
            self._observer.stop()
            await asyncio.to_thread(self._observer.join, 2)
        await self.client.close()

    async def __aenter__(self) -> AgentSession:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
