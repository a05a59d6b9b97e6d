"""One store operation, one transaction, and what a failure of it means.

A connection lost before COMMIT means nothing was written: the runner reconnects and runs the
operation again, a bounded number of times (a longer outage is the caller's to report as
``not_sent``). A connection lost during COMMIT is never retried: that is ``StoreInDoubt`` on
PostgreSQL, for the caller to resolve by reading back by id (see ``engine.commit_failed``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from crossintercom.errors import StoreUnavailable
from crossintercom.storage import engine as db
from crossintercom.storage.urls import StoreURL

T = TypeVar("T")
log = logging.getLogger(__name__)
# An operation that lost its connection before anything committed runs this many times in all,
# waiting BACKOFF_S, then twice that, up to BACKOFF_MAX_S, between attempts.
ATTEMPTS = 3
BACKOFF_S = 0.1
BACKOFF_MAX_S = 1.0


class TransactionRunner:
    def __init__(
        self, parsed: StoreURL, engine: Engine, *, deadline_s: float | None = None
    ) -> None:
        self.parsed = parsed
        self.engine = engine
        # A network store's operation that has not answered in this time is cut (see _guard).
        self.deadline_s = deadline_s
        # Short, bounded reconnect: a longer outage is the caller's to handle (not_sent).
        self._retry = Retrying(
            retry=retry_if_exception_type(StoreUnavailable),
            stop=stop_after_attempt(ATTEMPTS),
            wait=wait_exponential(multiplier=BACKOFF_S, max=BACKOFF_MAX_S),
            reraise=True,
        )

    def __call__(
        self,
        fn: Callable[[Connection], T],
        *,
        after: Callable[[], None] | None = None,
        retry: bool = True,
        single_statement: bool = False,
    ) -> T:
        """Run ``fn`` in one transaction, then ``after`` once it committed; reconnect (bounded)
        only before anything committed.

        ``single_statement``: ``fn`` runs exactly one statement, which is atomic by itself, so
        it runs without BEGIN/COMMIT (two round trips fewer). Only for reads and for writes
        whose repetition is harmless, since a connection lost mid-statement is retried.
        """
        if not retry:
            return self._once(fn, after, single_statement)
        result: T = self._retry(self._once, fn, after, single_statement)
        return result

    def _once(
        self,
        fn: Callable[[Connection], T],
        after: Callable[[], None] | None,
        single_statement: bool,
    ) -> T:
        try:
            conn = self.engine.connect()
            if single_statement:
                conn = db.autocommit(conn)
        except SQLAlchemyError as exc:
            raise db.unavailable(self.parsed, exc) from exc
        with conn, self._guard(conn):
            try:
                trans = conn.begin()
                result = fn(conn)
            except SQLAlchemyError as exc:
                error = db.translate(self.parsed, exc)
                if isinstance(error, StoreUnavailable) and not conn.invalidated:
                    # No pre-ping: a pooled connection the server dropped (restart,
                    # pg_terminate_backend) fails here, before any commit. Discard it so the
                    # retry gets a fresh one rather than the same dead socket.
                    conn.invalidate()
                raise error from exc
            try:
                trans.commit()
            except SQLAlchemyError as exc:
                raise db.commit_failed(self.parsed, exc) from exc
        if after is not None:
            after()
        return result

    @contextlib.contextmanager
    def _guard(self, conn: Connection) -> Iterator[None]:
        """Cut the connection's socket if the operation outlives ``deadline_s``.

        A blackholed connection gives neither an answer nor an error (keepalives and the TCP
        user timeout see a peer that acknowledges): the operation would wait for the network
        to return. Shutting the socket down makes the driver fail now, as a connection lost
        before COMMIT (retried on a new connection) or during it (in doubt, read back by id);
        docs/operations.md lists the timeout.
        """
        if self.deadline_s is None:
            yield
            return
        fd = _socket_fd(conn)
        if fd is None:
            yield
            return
        cut = threading.Event()
        deadline_s = self.deadline_s

        def on_deadline() -> None:
            cut.set()
            cut_socket(self.parsed, fd, deadline_s)

        token = _DEADLINES.arm(deadline_s, on_deadline)
        try:
            yield
        finally:
            _DEADLINES.disarm(token)
            if cut.is_set() and not conn.invalidated:
                with contextlib.suppress(Exception):
                    conn.invalidate()


def cut_socket(parsed: StoreURL, fd: int, deadline_s: float) -> None:
    """Shut down a driver's socket that outlived ``deadline_s``, so its operation fails now."""
    log.error(
        "store %s did not answer within %.0f s; cutting the connection and using a new one",
        parsed.masked,
        deadline_s,
    )
    with contextlib.suppress(OSError):
        # A duplicate of the driver's fd: shutdown acts on the shared socket and closing the
        # duplicate leaves the driver's own fd for it to close.
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


class _Deadlines:
    """One thread for every operation's deadline: a timer thread started per operation was a
    tenth of a relay's CPU time on the delivery path (py-spy, docs/performance.md)."""

    def __init__(self) -> None:
        self._due: dict[int, tuple[float, Callable[[], None]]] = {}
        self._next = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wake_at = 0.0  # when the watcher looks next

    def arm(self, after_s: float, fire: Callable[[], None]) -> int:
        with self._cond:
            self._next += 1
            at = time.monotonic() + after_s
            self._due[self._next] = (at, fire)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._watch, name="store-deadlines", daemon=True
                )
                self._thread.start()
            elif at < self._wake_at:
                self._cond.notify()  # due before the watcher would look: look again now
            return self._next

    def disarm(self, token: int) -> None:
        with self._cond:
            self._due.pop(token, None)

    def _watch(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                fired = [t for t, (at, _) in self._due.items() if at <= now]
                calls = [self._due.pop(t)[1] for t in fired]
                if not calls:
                    soonest = min((at for at, _ in self._due.values()), default=now + 60.0)
                    self._wake_at = soonest
                    self._cond.wait(max(0.0, soonest - now))
            for call in calls:
                call()


_DEADLINES = _Deadlines()


def _socket_fd(conn: Connection) -> int | None:
    dbapi: Any = conn.connection.dbapi_connection
    try:
        return int(dbapi.pgconn.socket)
    except Exception:  # not a psycopg connection (SQLite), or already closed
        return None
