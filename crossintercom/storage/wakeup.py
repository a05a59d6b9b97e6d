"""Wake-up hints: Postgres LISTEN/NOTIFY, and doorbell files watched with watchdog for SQLite.

A hint says what to look at: deliveries queued for the host, or receipts for it; on
PostgreSQL a receipts hint may carry the committed receipts themselves; a roster hint, sent to
every host, says some host published a new roster (docs/storage.md, "Wake-ups"). Every waiter
reports a catch-up (every kind) on its first ``wake`` and on every reconnect, and ``wake``
returns None after a quiet ``timeout``; the caller's poll backstop (the heartbeat's probe)
covers lost hints.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import msgspec
import psycopg
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from crossintercom.models import ReceiptOutcome
from crossintercom.runtime import replace_file
from crossintercom.storage import queries as q
from crossintercom.storage import sqlitetrust
from crossintercom.storage.engine import PG_KEEPALIVES, application_name, is_failover_error
from crossintercom.storage.interface import CATCH_UP, ReceiptRow, Wake

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
# A quiet listener proves its connection with a query this often (a commit each, so rarely:
# an idle relay's load is its heartbeat, docs/operations.md "Sizing"): a dropped connection
# also shows as an error on the wait, keepalives cover a silent network, and a hint missed
# meanwhile is found by the heartbeat's probe.
HEALTH_EVERY_S = 600.0

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


def connection_lost(exc: BaseException) -> bool:
    """The listener's connection is gone or unusable for LISTEN: the server dropped it, or it
    is a standby ("cannot execute LISTEN during recovery"), or a primary a failover demoted.
    NOTIFYs are not replicated either: a hint sent to the old primary is lost with it, which
    the catch-up after the reconnect (to the primary now) covers."""
    return isinstance(exc, psycopg.OperationalError) or is_failover_error(exc)


class PostgresWaiter(_ClosedOnExit):
    """A dedicated autocommit connection that LISTENs on one host's channel."""

    def __init__(
        self,
        conninfo: str,
        host_id: str,
        notify: Callable[[], None],
        *,
        connect_timeout: float = 5.0,
        trust_hints: bool = True,
    ) -> None:
        self._conninfo = conninfo
        self._trust_hints = trust_hints
        self._notify = notify
        self.channel = channel_name(host_id)
        self._host_id = host_id
        self._connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._reconnected = False
        self._proven = time.monotonic()
        self.reconnects = 0

    def __enter__(self) -> Self:
        self._connect()
        return self

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def connected(self) -> bool:
        """Whether the LISTEN connection is open (the metrics' ``listener_up``)."""
        return self._conn is not None and not self._conn.closed and not self._conn.broken

    @property
    def backend_pid(self) -> int | None:
        return self._conn.info.backend_pid if self._conn is not None else None

    def _connect(self) -> None:
        self.close()
        conn = psycopg.connect(
            self._conninfo,
            autocommit=True,
            connect_timeout=max(1, int(self._connect_timeout)),
            # A fallback: an application_name of the user's (in the URL) wins.
            fallback_application_name=application_name("listen", self._host_id),
            **PG_KEEPALIVES,
        )
        try:
            conn.execute(q.pg_listen(self.channel))
            conn.execute(q.pg_listen(ROSTER_CHANNEL))
        except BaseException:
            conn.close()  # a standby refuses LISTEN: the next try looks for the primary
            raise
        self._conn = conn
        # Anything sent while nobody listened is found by the caller's catch-up query.
        self._reconnected = True

    def _reconnect(self, budget: float) -> bool:
        retrying = Retrying(
            retry=retry_if_exception(connection_lost),
            stop=stop_after_delay(max(budget, 0.0)),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            reraise=True,
        )
        try:
            retrying(self._connect)
        except psycopg.Error as exc:
            if not connection_lost(exc):
                raise
            log.warning("listener reconnect failed: %s", str(exc).splitlines()[0] if exc else "")
            return False
        self.reconnects += 1
        return True

    def wait(self, timeout: float) -> bool:
        return self.wake(timeout) is not None

    def wake(self, timeout: float) -> Wake | None:
        deadline = time.monotonic() + timeout
        if (self._conn is None or self._conn.closed) and not self._reconnect(timeout):
            return None
        if self._reconnected:
            self._reconnected = False
            return CATCH_UP
        assert self._conn is not None
        try:
            # Consumed whole: closing the generator early drops the rest of a packet.
            got = list(self._conn.notifies(timeout=timeout, stop_after=1))
            if not got:
                if time.monotonic() - self._proven >= HEALTH_EVERY_S:
                    # Quiet is normal; a dead connection is not. Find out now.
                    self._conn.execute(q.PG_HEALTH)
                    self._proven = time.monotonic()
                return None
            got += self._conn.notifies(timeout=0)  # whatever else already arrived
            self._proven = time.monotonic()
            wake = Wake()
            for n in got:
                wake |= parse_hint(n.payload)
            if wake.hinted and not self._trust_hints:
                return Wake(wake.deliveries, receipts=True)  # read the rows instead
            return wake
        except psycopg.Error as exc:
            if not connection_lost(exc):
                raise
            log.info("listener connection lost; reconnecting")
            if self._reconnect(deadline - time.monotonic()):
                self._reconnected = False
                return CATCH_UP
            return None

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
