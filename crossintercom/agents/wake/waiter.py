"""`crossintercom wait`: block until NAME has unseen mail, coalesce a burst, hand it over once.

The waiter holds NAME's wait lock (one waiter per name), joins NAME's session in ``auto`` mode
(which pulls mail queued while NAME was away into the inbox), waits for an unseen message, lets
a burst settle for a short quiet window, and gives the messages to ``write``. What it showed is
marked shown only after ``write`` returned, i.e. after the output was written and flushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from crossintercom.agents.lifetime.lifeline import parse_pid
from crossintercom.agents.session import AgentSession, Busy, agents_dir, unseen
from crossintercom.client import Identity
from crossintercom.config import Settings
from crossintercom.errors import InboxUnavailable
from crossintercom.inbox import Entry
from crossintercom.inbox_faults import steady, steady_call
from crossintercom.runtime import group_gid, modes, open_file, secure_file

# A burst (several messages within moments) is handed over as one wake, but never held longer
# than this after the first message arrived.
DEFAULT_QUIET_S = 0.3
MAX_COALESCE_S = 3.0
REPLACE_WAIT_S = 5.0


def _holder_is_waiter(pid: int) -> bool:
    """Only a crossintercom waiter is ever asked to step aside (never a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(b"crossintercom" in part for part in cmdline) and b"wait" in cmdline


@contextlib.contextmanager
def waiter_lock(
    settings: Settings, session_id: str, *, replace: bool, lock: str = "wait"
) -> Iterator[None]:
    """Hold NAME's wait lock; with ``replace``, ask the waiter holding it to step aside.

    The lock file holds the holder's pid (cleared before release), so a newer hook waiter can
    take over from one started at an earlier Stop (docs/agents.md#wait).
    """
    path = agents_dir(settings) / f"{session_id}.{lock}.lock"
    fd = open_file(path, os.O_RDWR | os.O_CREAT, modes(settings)[1], gid=group_gid(settings))
    secure_file(settings, path)
    try:
        deadline = time.monotonic() + REPLACE_WAIT_S
        asked: set[int] = set()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            if not replace or time.monotonic() > deadline:
                raise Busy(
                    f"another `crossintercom wait` already waits for this session's mail "
                    f"(lock {path.name}); pass --replace to take over"
                ) from None
            pid = parse_pid(os.pread(fd, 32, 0).decode(errors="replace"))
            if pid is not None and pid not in asked and _holder_is_waiter(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                asked.add(pid)
            time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


async def _settle(session: AgentSession, quiet: float) -> None:
    """Let a burst finish: return once no new message came for ``quiet`` seconds (or the
    inbox cannot be read: showing then waits for it)."""
    end = time.monotonic() + MAX_COALESCE_S
    with contextlib.suppress(InboxUnavailable):
        count = len(unseen(session.inbox))
        while time.monotonic() < end:
            await asyncio.sleep(quiet)
            now = len(unseen(session.inbox))
            if now == count:
                return
            count = now


async def wait_on(
    session: AgentSession,
    write: Callable[[list[Entry]], list[Entry]],
    *,
    timeout: float,
    quiet: float = DEFAULT_QUIET_S,
    stop: asyncio.Event,
) -> list[Entry]:
    """On a held session: wait up to ``timeout`` seconds for mail its wake policy wakes for,
    let a burst settle, hand it to ``write``; [] on timeout or once ``stop`` is set."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    def ended() -> bool:
        return stop.is_set() or loop.time() >= deadline

    # A full or read-only inbox is waited out until the deadline, never the end of the waiter
    # (docs/reliability.md): each read is tried again until it works.
    while not await steady(session.woken, ended):
        remaining = deadline - loop.time()
        if remaining <= 0 or stop.is_set():
            return []
        changed = loop.create_task(session.wait_changed(remaining))
        stopped = loop.create_task(stop.wait())
        await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in (changed, stopped):
            task.cancel()
    if stop.is_set():
        return []
    await _settle(session, quiet)
    if stop.is_set():
        return []
    return await steady_call(lambda: session.show(write), stop.is_set) or []


async def wait_for_mail(
    settings: Settings,
    identity: Identity,
    write: Callable[[list[Entry]], list[Entry]],
    *,
    timeout: float,
    quiet: float = DEFAULT_QUIET_S,
    replace: bool = False,
    lock: str = "wait",
) -> list[Entry]:
    """Wait up to ``timeout`` seconds for unseen mail; hand it to ``write``; [] on timeout.

    Returns what ``write`` showed (it may leave messages for the next wake: its budget,
    docs/agents.md#one-hand-over).

    ``lock`` names the lock held while waiting: ``wait`` (one waiter per name), or ``socket``
    for the Claude Code messaging-socket child, which waits beside the Stop hook (the show lock
    keeps each message shown once). SIGTERM (a newer waiter taking over, or the harness ending
    the hook) ends the wait quietly with nothing shown: the signal is handled between steps, so
    a hand-over already writing completes first, and unshown mail stays for the next surface.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        with waiter_lock(settings, identity.id, replace=replace, lock=lock):
            async with AgentSession(settings, identity) as session:
                return await wait_on(session, write, timeout=timeout, quiet=quiet, stop=stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
