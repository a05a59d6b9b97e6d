"""PostgreSQL's driver: SQLAlchemy's asyncio engine over psycopg's async connection, each
operation's body run on the caller's event loop (``AsyncConnection.run_sync``: a greenlet, no
thread hop), with what ``driver.Driver`` owns on top: the deadline that cuts a server that
never answers, a pooled connection found dead replaced before use, the plans refreshed on a
schedule, and the row-security question asked once (docs/storage.md, "The driver"). The
wake-ups' LISTEN runs on the same pooled connection (``Listens``; docs/storage.md,
"Connections").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import pq
from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.util.concurrency import await_

from crossintercom.errors import StoreError
from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage.driver import Body, Driver, Op, in_transaction, loop_blocked
from crossintercom.storage.plans import PlanRefresh
from crossintercom.storage.urls import StoreURL

T = TypeVar("T")
log = logging.getLogger(__name__)


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


def alive(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle pooled connection still has its server, without a round trip. One the
    server ended while idle (a restart, ``pg_terminate_backend``) has its socket readable:
    replacing it before use keeps a write from being sent into a dead socket, where it would
    be in doubt."""
    if conn.closed or conn.broken:
        return False
    pgconn = conn.pgconn
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return True  # a statement is under way on it: that one sees a loss
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN)
    # The server's last words (an error saying why it ends the session) come before its EOF:
    # read until nothing is left. A notice or a parameter change leaves it quiet and alive.
    for _ in range(8):
        if not poller.poll(0):
            return pgconn.status == pq.ConnStatus.OK
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            return False
    return False


class HintSink(Protocol):
    """Who is told of the notifications on some channels (a waiter); called on the loop."""

    def hint(self, payload: str) -> None: ...

    def listening(self) -> None:
        """LISTEN runs on a new connection: whatever was sent meanwhile went unheard."""


AConn = psycopg.AsyncConnection[Any]
RELISTEN_BACKOFF_MAX_S = 2.0


class Listens:
    """LISTEN on the store's own pooled connection, so a relay holds one connection, not two
    (docs/storage.md, "Connections").

    psycopg hands a notification to the connection's notify handlers whenever it reads one:
    during a statement, or, while the connection idles in the pool, when the loop finds its
    socket readable (``loop.add_reader``, removed again at checkout, before any statement).
    Every connection the pool hands out LISTENs on the sinks' channels before its first
    statement; on a new connection (a reconnect after a restart, a failover, a cut socket,
    ``pg_terminate_backend``) every sink is told ``listening``, which its waiter reports as a
    catch-up. A connection lost while idle (its socket at EOF) or invalidated is replaced at
    once by an operation that runs no statement, retried with backoff until it succeeds."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sinks: dict[HintSink, frozenset[str]] = {}
        # The connection LISTENing now and on which channels; None when it is lost.
        self.conn: AConn | None = None
        self._heard: frozenset[str] = frozenset()
        self._fd: int | None = None  # its socket, watched while it idles in the pool
        self.setups = 0  # connections LISTEN was set up on
        self.closed = False
        self._task: asyncio.Task[None] | None = None
        # An operation that only checks a connection out (set by the driver).
        self.ensure: Callable[[], Awaitable[None]] | None = None

    @property
    def channels(self) -> frozenset[str]:
        return frozenset().union(*self.sinks.values())

    @property
    def up(self) -> bool:
        """Whether a connection LISTENs now (the metrics' ``listener_up``)."""
        conn = self.conn
        return conn is not None and not conn.closed and not conn.broken

    # -- pool events: on the loop's thread, inside the operation's greenlet ------------------

    def on_checkout(self, conn: AConn) -> None:
        self._unwatch()
        if conn is self.conn:
            self._drain(conn)  # what the liveness check read
        channels = self.channels
        if not channels:
            return
        if conn is not self.conn:
            self._listen(conn, channels, fresh=True)
        elif not channels <= self._heard:
            self._listen(conn, channels - self._heard, fresh=False)

    def _listen(self, conn: AConn, channels: frozenset[str], *, fresh: bool) -> None:
        try:
            was = conn.autocommit
            await_(conn.set_autocommit(True))
            for channel in sorted(channels):
                await_(conn.execute(q.pg_listen(channel)))
            await_(conn.set_autocommit(was))
        except psycopg.Error as exc:
            # Gone, or a standby ("cannot execute LISTEN during recovery"): the pool replaces
            # it with a new connection, as it does one found dead.
            raise DisconnectionError(f"LISTEN failed: {db.one_line(exc)}") from exc
        if fresh:
            conn.add_notify_handler(self._notified)
            self.conn, self._heard = conn, channels
            self.setups += 1
            for sink in list(self.sinks):
                sink.listening()
        else:
            self._heard |= channels

    def on_checkin(self, conn: AConn | None) -> None:
        if conn is None or conn is not self.conn or self.closed or self.loop is None:
            return
        pgconn = conn.pgconn
        if pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return
        if self._drain(conn):
            self._fd = pgconn.socket
            self.loop.add_reader(self._fd, self._readable, conn)

    def on_gone(self, conn: AConn | None, *, replace: bool) -> None:
        """A connection invalidated or closed: if it was the one LISTENing, none is now."""
        if conn is None or conn is not self.conn:
            return
        self._unwatch()
        self.conn, self._heard = None, frozenset()
        if replace:
            self._replace()

    # -- while idle in the pool ----------------------------------------------------------

    def _readable(self, conn: AConn) -> None:
        if conn is not self.conn:
            self._unwatch()
            return
        try:
            conn.pgconn.consume_input()
        except psycopg.OperationalError:
            self._lost()
            return
        self._drain(conn)

    def _drain(self, conn: AConn) -> bool:
        """Hand the notifications read so far to the handlers; False when the connection is
        found lost (its server ended it)."""
        pgconn = conn.pgconn
        try:
            while (n := pgconn.notifies()) is not None:
                if pgconn.notify_handler is not None:
                    pgconn.notify_handler(n)
        except psycopg.OperationalError:
            pass
        if pgconn.status != pq.ConnStatus.OK:
            self._lost()
            return False
        return True

    def _notified(self, n: psycopg.Notify) -> None:
        for sink, channels in list(self.sinks.items()):
            if n.channel in channels:
                sink.hint(n.payload)

    def _lost(self) -> None:
        log.info("the store's connection was lost while idle; reconnecting to LISTEN")
        self._unwatch()
        self.conn, self._heard = None, frozenset()
        self._replace()

    def _unwatch(self) -> None:
        if self._fd is not None and self.loop is not None:
            self.loop.remove_reader(self._fd)
        self._fd = None

    def _replace(self) -> None:
        if self.closed or not self.sinks or self.loop is None:
            return
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._relisten())

    async def _relisten(self) -> None:
        delay = 0.05
        while not self.closed and self.sinks and not self.up and self.ensure is not None:
            with contextlib.suppress(StoreError):
                await self.ensure()
            if self.up:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, RELISTEN_BACKOFF_MAX_S)

    def close(self) -> None:
        self.closed = True
        self._unwatch()
        if self._task is not None:
            self._task.cancel()


def _checked_out(_conn: Any) -> None:
    """An operation's body that runs no statement: the checkout (LISTEN on a new connection)
    is the point."""


def async_engine(
    parsed: StoreURL,
    *,
    pool_size: int,
    app_name: str | None,
    pooled: bool = True,
    listens: Listens | None = None,
) -> AsyncEngine:
    """The store's asyncio engine; ``pooled=False``: a connection per operation; ``listens``:
    its connections LISTEN for it."""
    args = db.pg_connect_args(db.PG_STATEMENT_TIMEOUT_MS, app_name)
    if not pooled:
        return create_async_engine(parsed.url, poolclass=NullPool, connect_args=args)
    engine = create_async_engine(
        parsed.url,
        pool_size=pool_size,
        max_overflow=0,
        # No pre-ping (a round trip per operation): ``alive`` looks at the socket instead.
        connect_args=args,
    )

    @event.listens_for(engine.sync_engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        if not alive(dbapi_conn.driver_connection):
            raise DisconnectionError("the server ended the pooled connection")  # a new one
        # Plans made on the tables as they are now (storage/plans.py), on the connection's
        # own schedule: run inside the next operation's own transaction (``in_transaction``),
        # so a refresh is never a commit of its own (an idle relay commits once a beat).
        refresh = record.info.setdefault(db.PLANS_KEY, PlanRefresh()).statement()
        if refresh is not None:
            record.info[db.PLANS_DUE_KEY] = refresh
        if listens is not None:
            listens.on_checkout(dbapi_conn.driver_connection)

    if listens is not None:

        def driver_conn(dbapi_conn: Any) -> Any:
            return None if dbapi_conn is None else dbapi_conn.driver_connection

        @event.listens_for(engine.sync_engine, "checkin")
        def _on_checkin(dbapi_conn: Any, _record: Any) -> None:
            listens.on_checkin(driver_conn(dbapi_conn))

        @event.listens_for(engine.sync_engine, "invalidate")
        def _on_invalidate(dbapi_conn: Any, _record: Any, _exc: Any) -> None:
            listens.on_gone(driver_conn(dbapi_conn), replace=True)

        @event.listens_for(engine.sync_engine, "close")
        def _on_close(dbapi_conn: Any, _record: Any) -> None:
            listens.on_gone(driver_conn(dbapi_conn), replace=False)

    return engine


class PgDriver(Driver):
    def __init__(
        self,
        parsed: StoreURL,
        *,
        pool_size: int = db.PG_POOL_SIZE,
        app_name: str | None = None,
        deadline_s: float = db.PG_OPERATION_DEADLINE_S,
    ) -> None:
        super().__init__(parsed)
        self.listens = Listens()
        self.listens.ensure = self._ensure_listening
        self.engine = async_engine(
            parsed, pool_size=pool_size, app_name=app_name, listens=self.listens
        )
        self._app_name = app_name
        # For ``aside`` while the pool is taken: made on first such use.
        self._aside: AsyncEngine | None = None
        # An operation whose server has not answered in this time has its socket cut.
        self.deadline_s = deadline_s
        self._row_security: bool | None = None

    async def row_security(self) -> bool:
        """Whether row-level security applies to the store's role (a per-host role, `db
        grant-host`); asked once."""
        if self._row_security is None:
            found = await self.run(lambda c: c.execute(q.PG_ROW_SECURITY).scalar(), retry=False)
            self._row_security = bool(found)
        return self._row_security

    async def listen(self, sink: HintSink, channels: frozenset[str]) -> None:
        """Tell ``sink`` of the notifications on ``channels`` from now on: LISTEN on the
        pooled connection before this returns (``StoreError`` if it cannot be reached)."""
        self._bind()
        self.listens.loop = self.loop
        self.listens.sinks[sink] = channels
        try:
            await self._ensure_listening()
        except BaseException:
            self.listens.sinks.pop(sink, None)
            raise

    @property
    def listens_up(self) -> bool:
        return self.listens.up

    @property
    def listen_setups(self) -> int:
        return self.listens.setups

    @property
    def listen_pid(self) -> int | None:
        conn = self.listens.conn
        return conn.info.backend_pid if conn is not None and self.listens.up else None

    def unlisten(self, sink: HintSink) -> None:
        """No more notifications for ``sink`` (on the loop); its channels stay LISTENed on
        the connection, harmless, until it is replaced."""
        self.listens.sinks.pop(sink, None)

    async def _ensure_listening(self) -> None:
        await self.run(_checked_out, single_statement=True, retry=False)

    async def aside(self, fn: Body[T]) -> T:
        """One statement that must answer while every pooled connection waits behind a lock
        (``stuck_transactions``): on a free pooled connection, else on one opened for it."""
        self._bind()
        engine = self.engine
        pool: Any = engine.sync_engine.pool
        if pool.checkedout() >= pool.size():
            if self._aside is None:
                self._aside = async_engine(
                    self.parsed, pool_size=1, app_name=self._app_name, pooled=False
                )
            engine = self._aside
        return await self._on(engine, Op(fn, single_statement=True))

    async def _once(self, op: Op[T]) -> T:
        return await self._on(self.engine, op)

    async def _on(self, engine: AsyncEngine, op: Op[T]) -> T:
        conn = engine.connect()
        try:
            await conn.start()
        except SQLAlchemyError as exc:
            raise db.unavailable(self.parsed, exc) from exc
        try:
            result = await self._guarded(conn, op)
        finally:
            await conn.close()
        if op.after is not None:
            op.after()
        return result

    async def _guarded(self, conn: AsyncConnection, op: Op[T]) -> T:
        """``op`` with its socket cut if the operation outlives the deadline.

        A blackholed connection gives neither an answer nor an error (keepalives and the TCP
        user timeout see a peer that acknowledges): the operation would wait for the network
        to return. Shutting the socket down makes the driver fail now, as a connection lost
        before COMMIT (retried on a new connection) or during it (in doubt, read back by id);
        docs/operations.md lists the timeout."""
        raw = await conn.get_raw_connection()
        fd = raw.dbapi_connection.driver_connection.pgconn.socket  # type: ignore[union-attr]
        cut = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_deadline(due: float) -> None:
            blocked = loop_blocked(due)
            if blocked is not None:
                # The loop could not run this timer (nor read the store's answer) for that
                # long: the process was busy, not the store. The store gets its deadline
                # again, counted from now.
                log.warning(
                    "this process's event loop was blocked for over %.1f s (work on the loop, "
                    "not the store); store %s gets its %.0f s again",
                    blocked,
                    self.parsed.masked,
                    self.deadline_s,
                )
                timer[0] = arm()
                return
            cut.set()
            cut_socket(self.parsed, fd, self.deadline_s)

        def arm() -> asyncio.TimerHandle:
            due = loop.time() + self.deadline_s
            return loop.call_at(due, on_deadline, due)

        timer = [arm()]  # the one armed now
        try:
            return await conn.run_sync(in_transaction, self.parsed, op)
        finally:
            timer[0].cancel()
            if cut.is_set() and not conn.invalidated:
                with contextlib.suppress(Exception):
                    await conn.invalidate()

    async def aclose(self) -> None:
        self.listens.close()
        await self.engine.dispose()
        if self._aside is not None:
            await self._aside.dispose()
