"""PostgreSQL's driver: SQLAlchemy's asyncio engine over psycopg's async connection, each
operation's body run on the caller's event loop (``AsyncConnection.run_sync``: a greenlet, no
thread hop), with what ``driver.Driver`` owns on top: the deadline that cuts a server that
never answers, a pooled connection found dead replaced before use, the plans refreshed on a
schedule, and the row-security question asked once (docs/storage.md, "The driver").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

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


def async_engine(
    parsed: StoreURL, *, pool_size: int, app_name: str | None, pooled: bool = True
) -> AsyncEngine:
    """The store's asyncio engine; ``pooled=False``: a connection per operation."""
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
        self.engine = async_engine(parsed, pool_size=pool_size, app_name=app_name)
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
        await self.engine.dispose()
        if self._aside is not None:
            await self._aside.dispose()
