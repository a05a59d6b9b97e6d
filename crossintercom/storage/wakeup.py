"""Wake-up hints: Postgres LISTEN/NOTIFY, and doorbell files watched with watchdog for SQLite.

A hint only says "look again"; it never carries a row. Every waiter reports a wake-up on its
first ``wait`` (and on every reconnect) so the caller runs a catch-up query, and ``wait`` also
returns after ``timeout`` so the caller's periodic poll is the backstop for lost hints.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psycopg
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from crossintercom.storage import queries as q
from crossintercom.storage.engine import PG_KEEPALIVES

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5


def host_key(host_id: str) -> str:
    return hashlib.sha256(host_id.encode()).hexdigest()[:16]


def channel_name(host_id: str) -> str:
    """``ci_`` + 16 hex: host ids may hold characters an identifier cannot, and 63 bytes max."""
    return f"ci_{host_key(host_id)}"


def doorbell_dir(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".doorbells")


def doorbell_path(db_path: Path, host_id: str) -> Path:
    return doorbell_dir(db_path) / host_key(host_id)


def ring_doorbell(db_path: Path, host_id: str) -> None:
    """Rewrite the host's doorbell file: a content change is seen by inotify and by polling."""
    bell = doorbell_path(db_path, host_id)
    bell.parent.mkdir(exist_ok=True)
    tmp = bell.with_name(f"{bell.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(f"{time.time_ns()}\n")
    os.replace(tmp, bell)


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


class PostgresWaiter(_ClosedOnExit):
    """A dedicated autocommit connection that LISTENs on one host's channel."""

    def __init__(
        self,
        conninfo: str,
        host_id: str,
        notify: Callable[[], None],
        *,
        connect_timeout: float = 5.0,
    ) -> None:
        self._conninfo = conninfo
        self._notify = notify
        self.channel = channel_name(host_id)
        self._connect_timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._reconnected = False
        self.reconnects = 0

    def __enter__(self) -> Self:
        self._connect()
        return self

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def backend_pid(self) -> int | None:
        return self._conn.info.backend_pid if self._conn is not None else None

    def _connect(self) -> None:
        self.close()
        conn = psycopg.connect(
            self._conninfo,
            autocommit=True,
            connect_timeout=max(1, int(self._connect_timeout)),
            **PG_KEEPALIVES,
        )
        conn.execute(q.pg_listen(self.channel))
        self._conn = conn
        # Anything sent while nobody listened is found by the caller's catch-up query.
        self._reconnected = True

    def _reconnect(self, budget: float) -> bool:
        retrying = Retrying(
            retry=retry_if_exception_type(psycopg.OperationalError),
            stop=stop_after_delay(max(budget, 0.0)),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            reraise=True,
        )
        try:
            retrying(self._connect)
        except psycopg.OperationalError as exc:
            log.warning("listener reconnect failed: %s", str(exc).splitlines()[0] if exc else "")
            return False
        self.reconnects += 1
        return True

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if (self._conn is None or self._conn.closed) and not self._reconnect(timeout):
            return False
        if self._reconnected:
            self._reconnected = False
            return True
        assert self._conn is not None
        try:
            woken = any(True for _ in self._conn.notifies(timeout=timeout, stop_after=1))
            if not woken:
                # Quiet is normal; a dead connection is not. Find out now, not at the next hint.
                self._conn.execute(q.PG_HEALTH)
            return woken
        except psycopg.OperationalError:
            log.info("listener connection lost; reconnecting")
            if self._reconnect(deadline - time.monotonic()):
                self._reconnected = False
                return True
            return False

    def notify_self(self) -> None:
        """Send a hint to this waiter through the store (a health check end to end)."""
        self._notify()


class _Bell(FileSystemEventHandler):
    def __init__(self, bell: Path, event: threading.Event) -> None:
        self._bell = str(bell)
        self._event = event

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = {os.fsdecode(event.src_path), os.fsdecode(getattr(event, "dest_path", "") or "")}
        if self._bell in paths:
            self._event.set()


class DoorbellWaiter(_ClosedOnExit):
    """Watches one host's doorbell file next to the SQLite database."""

    def __init__(self, db_path: Path, host_id: str, *, polling: bool = False) -> None:
        self._db_path = db_path
        self._host_id = host_id
        self.bell = doorbell_path(db_path, host_id)
        self._event = threading.Event()
        self._polling = polling
        self._observer: Any = None

    def __enter__(self) -> Self:
        self.bell.parent.mkdir(exist_ok=True)
        observer = PollingObserver(timeout=POLL_INTERVAL_S) if self._polling else Observer()
        observer.schedule(_Bell(self.bell, self._event), str(self.bell.parent), recursive=False)
        observer.start()
        self._observer = observer
        self._event.set()  # first wait reports a wake-up: the caller catches up
        return self

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()
            self._observer = None

    def wait(self, timeout: float) -> bool:
        woken = self._event.wait(timeout)
        self._event.clear()
        return woken

    def notify_self(self) -> None:
        ring_doorbell(self._db_path, self._host_id)
