"""Wake-up hints: Postgres LISTEN/NOTIFY, and doorbell files watched with watchdog for SQLite.

A hint says what to look at: deliveries queued for the host, or receipts for it; on
PostgreSQL a receipts hint may carry the committed receipts themselves; a roster hint, sent to
every host, says some host published a new roster (docs/storage.md, "Wake-ups"). Every waiter
reports a catch-up (every kind) on its first ``wake`` and on every reconnect, and ``wake``
returns None after a quiet ``timeout``; the caller's poll backstop (the heartbeat's probe)
covers lost hints.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Protocol, Self, TypeVar

import msgspec
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from crossintercom.models import ReceiptOutcome
from crossintercom.runtime import replace_file
from crossintercom.storage import sqlitetrust
from crossintercom.storage.interface import CATCH_UP, ReceiptRow, Wake

T = TypeVar("T")
log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5

# What a hint names (the NOTIFY payload's first character, the doorbell file's suffix).
DELIVERIES: Final = "d"
RECEIPTS: Final = "r"
# Some host published its roster: one channel (PostgreSQL) or doorbell (SQLite) every relay
# watches, so rosters are imported when they change rather than on the next heartbeat.
ROSTER: Final = "o"
ROSTER_CHANNEL: Final = "ci_roster"
# A receipts hint carrying the receipts as JSON: "R" + [[id, message id, recipient session,
# recipient host, outcome, code, sender session, note], ...] (queries._PG_RECEIPT_HINTS writes
# it). Rows without the note come from a relay older than the receipts' note (no note to carry);
# a hint of any other shape is read as a plain receipts one.
RECEIPT_ROWS: Final = "R"
_hint_rows = msgspec.json.Decoder(
    list[tuple[int, str, str, str, ReceiptOutcome, str | None, str | None, str | None]]
)
_hint_rows_unnoted = msgspec.json.Decoder(
    list[tuple[int, str, str, str, ReceiptOutcome, str | None, str | None]]
)


def parse_hint(payload: str) -> Wake:
    """One NOTIFY payload as a ``Wake``; an empty or unknown one is a catch-up (an older
    relay's hint, ``notify_self``), a receipts hint that does not parse a plain receipts one."""
    kind, body = payload[:1], payload[1:]
    if kind == DELIVERIES:
        return Wake(deliveries=True)
    if kind == RECEIPTS:
        return Wake(receipts=True)
    if kind == ROSTER:
        return Wake(roster=True)
    if kind == RECEIPT_ROWS:
        for decoder in (_hint_rows, _hint_rows_unnoted):
            try:
                return Wake(hinted=tuple(ReceiptRow(*row) for row in decoder.decode(body)))
            except msgspec.DecodeError:
                continue
        return Wake(receipts=True)
    return CATCH_UP


# Filesystem types (as /proc/self/mountinfo names them) that carry no change notifications
# between machines: a write on another host raises no inotify event here. Any "fuse.*" too.
NO_CROSS_HOST_EVENTS: Final = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs", "ceph", "glusterfs",
        "lustre", "afs", "gpfs", "beegfs", "ocfs2", "gfs2", "davfs", "fuse", "fuseblk",
    }
)  # fmt: skip
MOUNTINFO: Final = Path("/proc/self/mountinfo")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: Path, mountinfo: Path = MOUNTINFO) -> str | None:
    """The type of the filesystem ``path`` (or its nearest existing parent) is on: the mount
    with the longest mount point above it; None where mountinfo cannot be read."""
    target = os.path.realpath(path)
    best, found = -1, None
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, sep, tail = line.partition(" - ")
        parts = fields.split()
        if not sep or len(parts) < 5 or not tail:
            continue
        point = _unescape(parts[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, found = len(point), tail.split()[0]
    return found


def polling_needed(path: Path) -> str | None:
    """The filesystem type when the store's doorbells must be polled (no change notifications
    across machines there), else None."""
    kind = filesystem_type(path)
    if kind is not None and (kind in NO_CROSS_HOST_EVENTS or kind.startswith("fuse.")):
        return kind
    return None


def host_key(host_id: str) -> str:
    return hashlib.sha256(host_id.encode()).hexdigest()[:16]


def channel_name(host_id: str) -> str:
    """``ci_`` + 16 hex: host ids may hold characters an identifier cannot, and 63 bytes max."""
    return f"ci_{host_key(host_id)}"


def doorbell_dir(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".doorbells")


def doorbell_path(db_path: Path, host_id: str, kind: str = DELIVERIES) -> Path:
    """One doorbell file per host and kind (deliveries, receipts), and one roster doorbell
    that every host watches."""
    if kind == ROSTER:
        return doorbell_dir(db_path) / "roster"
    key = host_key(host_id)
    return doorbell_dir(db_path) / (key if kind == DELIVERIES else f"{key}.{kind}")


# Read by the store's group (its dir keeps others out); the content is only a timestamp.
_BELL_MODE: Final = 0o640


def ring_doorbell(db_path: Path, host_id: str, kind: str = DELIVERIES) -> None:
    """Rewrite the host's doorbell file: a content change is seen by inotify and by polling."""
    bell = doorbell_path(db_path, host_id, kind)
    # Through a new file of a random name, created exclusively: the doorbell dir is shared
    # with the store's group, whose members could plant a link at a name we would write.
    try:
        replace_file(bell, f"{time.time_ns()}\n".encode(), _BELL_MODE)
    except FileNotFoundError:
        make_doorbell_dir(db_path)
        replace_file(bell, f"{time.time_ns()}\n".encode(), _BELL_MODE)


def make_doorbell_dir(db_path: Path) -> None:
    """The doorbell dir, private like the store file (0700, or 2770 with a group)."""
    sqlitetrust.private_dir(doorbell_dir(db_path), sqlitetrust.configured_gid())


class _ClosedOnExit:
    def close(self) -> None:
        raise NotImplementedError

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class PgListens(Protocol):
    """The driver's LISTEN (``pgdriver.PgDriver``): the waiter's side of it."""

    loop: asyncio.AbstractEventLoop | None

    @property
    def listens_up(self) -> bool: ...

    @property
    def listen_setups(self) -> int: ...

    @property
    def listen_pid(self) -> int | None: ...

    async def listen(self, sink: Any, channels: frozenset[str]) -> None: ...

    def unlisten(self, sink: Any) -> None: ...

    def blocking(self, coro: Coroutine[Any, Any, T]) -> T: ...


class PostgresWaiter(_ClosedOnExit):
    """One host's channel LISTENed on the store's own connection (``pgdriver.Listens``): the
    driver hands each notification to ``hint`` on its loop, and ``wake``, in the caller's
    thread, waits for them; no connection is held while it waits."""

    def __init__(
        self,
        driver: PgListens,
        host_id: str,
        notify: Callable[[], None],
        *,
        trust_hints: bool = True,
    ) -> None:
        self._driver = driver
        self._trust_hints = trust_hints
        self._notify = notify
        self.channel = channel_name(host_id)
        self._cond = threading.Condition()
        # What the hints since the last ``wake`` name; the first wake is a catch-up.
        self._pending: Wake | None = CATCH_UP
        self._entered = False
        self._setups = 0

    def __enter__(self) -> Self:
        self._driver.blocking(self._driver.listen(self, frozenset({self.channel, ROSTER_CHANNEL})))
        self._setups = self._driver.listen_setups
        self._entered = True
        return self

    def close(self) -> None:
        if not self._entered:
            return
        self._entered = False
        loop = self._driver.loop
        # Not waited for: the loop may be stopping (the relay's shutdown).
        with contextlib.suppress(RuntimeError):
            if loop is not None:
                loop.call_soon_threadsafe(self._driver.unlisten, self)

    @property
    def connected(self) -> bool:
        """Whether the store's connection LISTENs now (the metrics' ``listener_up``)."""
        return self._driver.listens_up

    @property
    def backend_pid(self) -> int | None:
        """The server process of the connection LISTENing now."""
        return self._driver.listen_pid

    @property
    def reconnects(self) -> int:
        """Connections LISTEN was set up on again since this waiter began (one lost each)."""
        return max(0, self._driver.listen_setups - self._setups) if self._entered else 0

    # -- on the driver's loop ------------------------------------------------------------

    def hint(self, payload: str) -> None:
        self._add(parse_hint(payload))

    def listening(self) -> None:
        # Anything sent while nobody listened is found by the caller's catch-up query.
        self._add(CATCH_UP)

    def _add(self, wake: Wake) -> None:
        with self._cond:
            self._pending = wake if self._pending is None else self._pending | wake
            self._cond.notify_all()

    # -- in the caller's thread ----------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        return self.wake(timeout) is not None

    def wake(self, timeout: float) -> Wake | None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._pending is not None, timeout):
                return None
            wake, self._pending = self._pending, None
        assert wake is not None
        if wake.hinted and not self._trust_hints:
            return dataclasses.replace(wake, receipts=True, hinted=())  # read the rows instead
        return wake

    def notify_self(self) -> None:
        """Send a hint to this waiter through the store (a health check end to end)."""
        self._notify()


class _Bell(FileSystemEventHandler):
    """Notes which of the host's doorbells rang (by kind) and sets the event."""

    def __init__(self, bells: dict[str, str], event: threading.Event) -> None:
        self._bells = bells  # path -> kind
        self._event = event
        self._lock = threading.Lock()
        self.rung: set[str] = set()

    def ring(self, kinds: set[str]) -> None:
        with self._lock:
            self.rung |= kinds
        self._event.set()

    def take(self) -> set[str]:
        with self._lock:
            rung, self.rung = self.rung, set()
        return rung

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = {os.fsdecode(event.src_path), os.fsdecode(getattr(event, "dest_path", "") or "")}
        kinds = {kind for path, kind in self._bells.items() if path in paths}
        if kinds:
            self.ring(kinds)


class DoorbellWaiter(_ClosedOnExit):
    """Watches one host's doorbell file next to the SQLite database."""

    def __init__(self, db_path: Path, host_id: str, *, polling: bool = False) -> None:
        self._db_path = db_path
        self._host_id = host_id
        self.bell = doorbell_path(db_path, host_id)
        self._event = threading.Event()
        kinds = (DELIVERIES, RECEIPTS, ROSTER)
        bells = {str(doorbell_path(db_path, host_id, k)): k for k in kinds}
        self._handler = _Bell(bells, self._event)
        self._polling = polling
        self._observer: Any = None

    def __enter__(self) -> Self:
        make_doorbell_dir(self._db_path)
        observer = PollingObserver(timeout=POLL_INTERVAL_S) if self._polling else Observer()
        observer.schedule(self._handler, str(self.bell.parent), recursive=False)
        observer.start()
        self._observer = observer
        # The first wait reports a wake-up for every kind: the caller catches up.
        self._handler.ring({DELIVERIES, RECEIPTS, ROSTER})
        return self

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()
            self._observer = None

    def wait(self, timeout: float) -> bool:
        return self.wake(timeout) is not None

    def wake(self, timeout: float) -> Wake | None:
        if not self._event.wait(timeout):
            return None
        self._event.clear()
        rung = self._handler.take()
        if not rung:
            return None
        return Wake(deliveries=DELIVERIES in rung, receipts=RECEIPTS in rung, roster=ROSTER in rung)

    def notify_self(self) -> None:
        ring_doorbell(self._db_path, self._host_id)
