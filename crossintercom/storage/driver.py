"""The driver port: how one store operation runs, and what a failure of it means.

Every operation of the store is a plain function of a SQLAlchemy ``Connection`` (its body,
written once); ``Driver.run`` runs it as one transaction and owns everything around it, once:
the bounded retry, the deadline, the in-doubt commit and the error translation. Two drivers:
``pgdriver.PgDriver`` (SQLAlchemy's asyncio engine over psycopg's async connection, the body
on the caller's event loop) and ``SqliteDriver`` here (the blocking engine, the whole
transaction in a worker thread). docs/storage.md, "The driver".

A connection lost before COMMIT means nothing was written: the driver runs the operation
again on a new connection, a bounded number of times (a longer outage is the caller's to
report as ``not_sent``). A connection lost during COMMIT, or after a write sent in autocommit,
is never retried: that is ``StoreInDoubt`` on PostgreSQL, for the caller to resolve by reading
back by id (see ``engine.commit_failed``).
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.util.concurrency import await_, in_greenlet

from crossintercom.errors import (
    CrossintercomError,
    StoreError,
    StoreLocksUnsafe,
    StoreUnavailable,
)
from crossintercom.storage import engine as db
from crossintercom.storage import lockcheck
from crossintercom.storage.interface import StoreObserver
from crossintercom.storage.urls import StoreURL

T = TypeVar("T")
Body = Callable[[Connection], T]
# An operation that lost its connection before anything committed runs this many times in all,
# waiting BACKOFF_S, then twice that, up to BACKOFF_MAX_S, between attempts.
ATTEMPTS = 3
BACKOFF_S = 0.1
BACKOFF_MAX_S = 1.0


def backoff_s(attempt: int) -> float:
    """The wait after failed attempt number ``attempt`` (1 on): BACKOFF_S, doubling, capped."""
    return float(min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (attempt - 1)))


def operation_name(fn: Callable[..., Any]) -> str:
    """The store method an operation's body belongs to (``enqueue`` for the ``write`` closure
    of ``sqlite.Sqlite.enqueue``): a name from the code, so a bounded metrics label."""
    outer = fn.__qualname__.split(".<locals>", 1)[0]
    return outer.rsplit(".", 1)[-1].lstrip("_") or "operation"


@dataclass(frozen=True, slots=True)
class Op(Generic[T]):
    """One operation as a driver runs it: its body, what to do once it committed (SQLite's
    doorbells), and how (``in_transaction``)."""

    fn: Body[T]
    after: Callable[[], None] | None = None
    single_statement: bool = False
    write: bool = False


def in_transaction(conn: Connection, parsed: StoreURL, op: Op[T]) -> T:
    """``op.fn`` in one transaction on ``conn``, its failures translated (``engine``).

    ``single_statement``: the body runs exactly one statement, atomic by itself, so it runs
    without BEGIN/COMMIT (two round trips fewer). A connection lost mid-statement is then
    retried, so only for reads and writes whose repetition is harmless, unless ``write``: a
    write whose loss after sending may have committed (in doubt, never retried)."""
    if op.single_statement:
        conn = db.autocommit(conn)
    try:
        trans = conn.begin()
        if not op.single_statement and (due := conn.connection.info.pop(db.PLANS_DUE_KEY, None)):
            # A plan refresh due on this connection (pgdriver.async_engine), in this
            # transaction: no commit of its own.
            conn.exec_driver_sql(due)
        result = op.fn(conn)
    except CrossintercomError:
        # The body's own refusal (a lock held too long, a quota): the transaction ends here,
        # whatever it wrote undone, and the refusal goes up as it is.
        _end(conn)
        raise
    except Exception as exc:
        if not isinstance(exc, SQLAlchemyError):
            # Anything else (a value no driver type reads, a bug in the body): its cursor may
            # still be open, holding SQLite's lock or a PostgreSQL transaction, so the
            # connection goes, and the caller gets a store error, not a stray exception.
            _end(conn, discard=True)
            # The body's frames hold its result, and so the cursor: SQLite closes a connection
            # (and lets go of its lock) only once every cursor of it is gone.
            traceback.clear_frames(exc.__traceback__)
            raise StoreError(
                f"store {parsed.masked} failed: {type(exc).__name__}: {db.one_line(exc)}"
            ) from exc
        lost = isinstance(exc, DBAPIError) and exc.connection_invalidated
        if op.write and op.single_statement and (lost or conn.invalidated):
            raise db.commit_failed(parsed, exc) from exc
        error = db.translate(parsed, exc)
        if isinstance(error, StoreUnavailable) and not conn.invalidated:
            # No pre-ping: a pooled connection the server dropped fails here, before any
            # commit. Discard it so the retry gets a fresh one rather than the same socket.
            conn.invalidate()
        raise error from exc
    try:
        trans.commit()
    except SQLAlchemyError as exc:
        raise db.commit_failed(parsed, exc) from exc
    return result


def _end(conn: Connection, *, discard: bool = False) -> None:
    """Roll back what the failed body began; ``discard``: close the connection too (an open
    cursor or a half-read result goes with it)."""
    try:
        if discard:
            conn.invalidate()
        else:
            conn.rollback()
    except Exception:  # ending it is best effort: the error being raised is the one to report
        conn.invalidate()


# A timer that fires this long after it was due found the event loop busy (work run on the
# loop itself), not the store slow: a deadline measured over that time would blame the store.
LOOP_LAG_S = 1.0


def loop_blocked(due: float) -> float | None:
    """How long past ``due`` (the running loop's clock) this runs, when that says the loop
    itself was blocked; None otherwise."""
    late = asyncio.get_running_loop().time() - due
    return late if late > LOOP_LAG_S else None


def off_loop(fn: Callable[[], T]) -> T:
    """``fn()`` inside an operation's body, but not on the event loop: on PostgreSQL the body
    runs on the loop (a greenlet), so CPU-bound work over rows another host wrote is handed to
    a thread while the loop serves the rest (the heartbeat); SQLite's bodies run in a worker
    thread already."""
    if in_greenlet():
        return await_(asyncio.to_thread(fn))
    return fn()


def call_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` from another thread and wait for it."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("a loop cannot block on its own coroutines: await instead")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class Driver:
    """Runs operation bodies for one store on one event loop (see ``run``)."""

    def __init__(self, parsed: StoreURL) -> None:
        self.parsed = parsed
        # The loop the store's operations run on, once one has run: pooled async connections
        # belong to it, and blocking callers of ``blocking`` hand their work to it.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.observer: StoreObserver | None = None

    async def run(
        self,
        fn: Body[T],
        *,
        after: Callable[[], None] | None = None,
        retry: bool = True,
        single_statement: bool = False,
        write: bool = False,
    ) -> T:
        """Run ``fn`` in one transaction, then ``after`` once it committed; reconnect
        (bounded) only before anything committed. ``single_statement`` and ``write``: see
        ``in_transaction``."""
        self._bind()
        op = Op(fn, after, single_statement, write)
        observer = self.observer
        if observer is None:
            return await self._attempts(op, retry)
        start = time.perf_counter()
        try:
            result = await self._attempts(op, retry)
        except CrossintercomError as exc:
            observer(operation_name(fn), time.perf_counter() - start, exc)
            raise
        observer(operation_name(fn), time.perf_counter() - start, None)
        return result

    async def _attempts(self, op: Op[T], retry: bool) -> T:
        if not retry:
            return await self._once(op)
        # A plain loop: a tenacity AsyncRetrying set up for every operation cost about 40 us
        # of CPU each, on every statement of the delivery path
        # (docs/perf-log/2026-12-07-peer-and-regression.md).
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return await self._once(op)
            except StoreUnavailable:
                if attempt == ATTEMPTS:
                    raise
            await asyncio.sleep(backoff_s(attempt))
        raise AssertionError("unreachable")

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = loop
        elif self.loop is not loop and not self.loop.is_closed():
            raise RuntimeError("a store's operations must all run on the loop that opened it")

    def blocking(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one of the store's coroutines from another thread (a waiter's), on its loop."""
        if self.loop is None:
            coro.close()
            raise RuntimeError("the store has not run an operation on any loop yet")
        return call_on(self.loop, coro)

    async def _once(self, op: Op[T]) -> T:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError


class SqliteDriver(Driver):
    """The blocking engine; each transaction, commit and doorbells included, in a worker
    thread, so the loop never waits on the file lock (``BEGIN IMMEDIATE``, busy timeout)."""

    def __init__(self, parsed: StoreURL, engine: Engine) -> None:
        super().__init__(parsed)
        self.engine = engine

    async def _once(self, op: Op[T]) -> T:
        return await asyncio.to_thread(self._in_thread, op)

    def _in_thread(self, op: Op[T]) -> T:
        """One attempt: connect, ``in_transaction``, give the connection back, ``op.after``."""
        parsed = self.parsed
        if parsed.path is not None and (why := lockcheck.refusal(parsed.path)):
            raise StoreLocksUnsafe(why)  # no transaction at all: two writers damage the file
        try:
            conn = self.engine.connect()
        except SQLAlchemyError as exc:
            raise db.unavailable(parsed, exc) from exc
        with conn:
            result = in_transaction(conn, parsed, op)
        if op.after is not None:
            op.after()
        return result

    async def aclose(self) -> None:
        await asyncio.to_thread(self.engine.dispose)
