"""The relay's delivery path on PostgreSQL: the path's statements on one psycopg
``AsyncConnection`` on the relay's own event loop, no thread hop and no SQLAlchemy per
statement (docs/storage.md, "The relay's hot path").

The statements are ``queries``' own, compiled once. Each runs in autocommit, as the blocking
store runs them: the generation fence, the rows and the NOTIFY inside one statement. Errors
mean what ``engine`` says they mean: a connection lost before anything was sent, or a
statement the server refused, is ``StoreUnavailable`` (retried a bounded number of times); an
enqueue whose connection was lost after it was sent may have committed, so it is
``StoreInDoubt``, for the relay to settle by enqueueing again. The fallbacks are the store's
own blocking methods in a thread: an enqueue under per-host roles (row-level security needs
its statements apart) and the rare items the one statement cannot answer.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

import psycopg
from psycopg import pq
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

from crossintercom.errors import StoreError, StoreInDoubt, StoreUnavailable
from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage.batches import (
    ack_params,
    add_receipts_params,
    plan_pg_enqueue,
    stale_enqueue,
)
from crossintercom.storage.hotpath import ThreadHotPath
from crossintercom.storage.interface import (
    DEFAULT_MAX_PAYLOAD_CHARS,
    MIGRATION_LOCK,
    Ack,
    EnqueueResult,
    InboundRow,
    LateReceipt,
    MailboxStore,
    OutboundItem,
    ReceiptRow,
    StoreSettings,
    StuckTransaction,
)
from crossintercom.storage.plans import PlanRefresh
from crossintercom.storage.sqlstore import inbound_query, inbound_row, utcnow
from crossintercom.storage.tables import metadata
from crossintercom.storage.transaction import ATTEMPTS, BACKOFF_MAX_S, BACKOFF_S, cut_socket
from crossintercom.storage.urls import StoreURL

_DIALECT = PGDialect_psycopg()  # type: ignore[no-untyped-call]
Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement of ``queries`` as psycopg runs it, with the values it binds itself."""

    text: str
    fixed: dict[str, Any]


@cache
def compiled(stmt: ClauseElement) -> Statement:
    done = stmt.compile(dialect=_DIALECT)
    assert isinstance(done, SQLCompiler)
    fixed = {name: bp.effective_value for bp, name in done.bind_names.items() if not bp.required}
    return Statement(done.string, fixed)


def stuck_params(idle_s: float) -> dict[str, Any]:
    return {
        "idle_s": idle_s,
        "tables": sorted(metadata.tables),
        "key": q.PG_MIGRATION_LOCK_KEY,
        "migration": MIGRATION_LOCK,
    }


def stuck_transaction(row: Sequence[Any]) -> StuckTransaction:
    pid, user, app, client, idle, tables, kind = row
    held = None if idle is None else float(idle)
    return StuckTransaction(int(pid), user, app or None, client, held, tuple(tables), kind)


class PgBacking(MailboxStore, Protocol):
    """What the hot path needs of its PostgreSQL store."""

    parsed: StoreURL
    skip_locked: bool
    arrays: bool
    # The connections' application_name (engine.application_name), None for the default.
    app_name: str | None

    def fresh_settings(self) -> StoreSettings | None: ...

    def remember_settings(self, row: Sequence[Any] | None) -> StoreSettings: ...


def _alive(conn: psycopg.AsyncConnection[Row]) -> bool:
    """Whether an idle connection still has its server. One the server ended while idle
    (a restart, ``pg_terminate_backend``) has its socket readable: replacing it before use
    keeps a statement from being sent into a dead socket, where an enqueue would be in doubt."""
    if conn.closed or conn.broken:
        return False
    pgconn = conn.pgconn
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return True  # another statement is under way on it: that one sees a loss
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


class PgHotPath:
    def __init__(self, store: PgBacking) -> None:
        self._store = store
        self._parsed = store.parsed
        self._thread = ThreadHotPath(store)
        self._conn: psycopg.AsyncConnection[Row] | None = None
        self._connecting = asyncio.Lock()
        self._row_security: bool | None = None
        # One schedule for its connections in turn (storage/plans.py).
        self.plans = PlanRefresh()

    @property
    def backend_pid(self) -> int | None:
        """The server process of its connection while it has one (for tests and operators)."""
        conn = self._conn
        return conn.info.backend_pid if conn is not None and not conn.closed else None

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    # -- running one statement ---------------------------------------------------------------

    async def _connection(self) -> psycopg.AsyncConnection[Row]:
        conn = self._conn
        if conn is not None and _alive(conn):
            return conn
        async with self._connecting:
            if self._conn is not None and _alive(self._conn):
                return self._conn
            await self.aclose()
            try:
                self._conn = await psycopg.AsyncConnection.connect(
                    self._parsed.libpq_conninfo(),
                    autocommit=True,
                    **db.pg_connect_args(db.PG_STATEMENT_TIMEOUT_MS, self._store.app_name),
                )
            except psycopg.Error as exc:
                raise db.unavailable(self._parsed, exc) from exc
            return self._conn

    async def _run(
        self, stmt: Statement, params: dict[str, Any], *, write: bool = False
    ) -> list[Row]:
        """``stmt`` once more after a loss before anything could commit, as the blocking
        store's runner does (transaction.py); ``write``: a loss after sending is in doubt."""
        for attempt in range(ATTEMPTS):
            try:
                return await self._once(stmt, params, write)
            except StoreUnavailable:
                if attempt == ATTEMPTS - 1:
                    raise
            await asyncio.sleep(min(BACKOFF_MAX_S, BACKOFF_S * 2**attempt))
        raise AssertionError("unreachable")

    async def _once(self, stmt: Statement, params: dict[str, Any], write: bool) -> list[Row]:
        conn = await self._connection()
        # The operation deadline of the blocking store (transaction._guard): a server that
        # never answers (a blackholed connection) has its socket cut, so the statement fails.
        deadline = db.PG_OPERATION_DEADLINE_S
        timer = asyncio.get_running_loop().call_later(
            deadline, cut_socket, self._parsed, conn.pgconn.socket, deadline
        )
        try:
            refresh = self.plans.statement()  # plans made on the tables as they are now
            if refresh is not None:
                try:
                    await conn.execute(refresh)
                except psycopg.Error as exc:  # sent before the statement: never in doubt
                    raise self._failed(conn, exc, False) from exc
            cur = await conn.execute(stmt.text, {**stmt.fixed, **params} if stmt.fixed else params)
            return await cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            raise self._failed(conn, exc, write) from exc
        finally:
            timer.cancel()

    def _failed(
        self, conn: psycopg.AsyncConnection[Row], exc: psycopg.Error, write: bool
    ) -> StoreError:
        if conn.broken or conn.closed:
            # Lost on the way: the next statement gets a new connection.
            if self._conn is conn:
                self._conn = None
            return (
                db.commit_failed(self._parsed, exc) if write else db.unavailable(self._parsed, exc)
            )
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            # The server refused it (a timeout, a lock): nothing committed, as the sync store
            # treats it.
            return db.unavailable(self._parsed, exc)
        return StoreError(f"store {self._parsed.masked} failed: {db.one_line(exc)}")

    # -- the operations ---------------------------------------------------------------------

    async def _settings(self) -> StoreSettings:
        found = self._store.fresh_settings()
        if found is not None:
            return found
        rows = await self._run(compiled(q.READ_SETTINGS), {})
        return self._store.remember_settings(rows[0] if rows else None)

    async def enqueue(
        self, items: Sequence[OutboundItem], *, generation: int | None = None
    ) -> list[EnqueueResult]:
        if not items:
            return []
        if self._row_security is None:
            [(active,)] = await self._run(compiled(q.PG_ROW_SECURITY), {})
            self._row_security = bool(active)
        if self._row_security:
            # A per-host role: its enqueue needs statements apart (PostgresStore.enqueue).
            return await self._thread.enqueue(items, generation=generation)
        run = plan_pg_enqueue(items, await self._settings(), utcnow(), generation)
        if run.params is None:
            return run.done()
        stmt = compiled(q.pg_enqueue(generation is not None))
        again = run.finish(await self._run(stmt, run.params, write=True))
        if again is None:
            raise stale_enqueue(items, generation)
        if again:
            # Rows a concurrent transaction committed while the statement waited on them
            # (batches.enqueue_pg): the store's enqueue reads them in new statements. The
            # statement above committed the rest, so a failure now leaves the batch in doubt.
            try:
                retried = await self._thread.enqueue(
                    [items[i] for i in again], generation=generation
                )
            except StoreError as exc:
                raise StoreInDoubt(
                    f"part of an enqueue to the store {self._parsed.masked} was written and "
                    f"the rest failed ({exc.message}): read it back by id"
                ) from exc
            for i, r in zip(again, retried, strict=True):
                run.results[i] = r
        return run.done()

    async def fetch_inbound(
        self,
        host_id: str,
        generation: int,
        *,
        limit: int = 500,
        session_ids: Collection[str] | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD_CHARS,
    ) -> list[InboundRow]:
        if session_ids is not None and not session_ids:
            return []
        store = self._store
        stmt, params = inbound_query(
            host_id, generation, limit, session_ids, max_payload, store.skip_locked, store.arrays
        )
        rows = await self._run(compiled(stmt), params)
        return [inbound_row(*row, max_payload=max_payload) for row in rows]

    async def ack(self, host_id: str, generation: int, acks: Sequence[Ack]) -> int:
        params = ack_params(host_id, generation, acks, utcnow())
        if params is None:
            return 0
        [row] = await self._run(compiled(q.PG_ACK), params)
        return int(row[0])

    async def receipts(
        self, host_id: str, generation: int, *, limit: int = 500
    ) -> list[ReceiptRow]:
        params = {"host_id": host_id, "generation": generation, "limit": limit}
        return [ReceiptRow(*r) for r in await self._run(compiled(q.LIST_RECEIPTS), params)]

    async def consume_receipts(
        self, host_id: str, generation: int, receipt_ids: Sequence[int]
    ) -> None:
        if receipt_ids:
            params = {"host_id": host_id, "generation": generation, "ids": list(receipt_ids)}
            await self._run(compiled(q.PG_CONSUME_RECEIPTS), params)

    async def add_receipts(
        self, host_id: str, generation: int, receipts: Sequence[LateReceipt]
    ) -> int:
        params = add_receipts_params(host_id, generation, receipts, utcnow())
        if params is None:
            return 0
        [row] = await self._run(compiled(q.PG_ADD_RECEIPTS), params)
        return int(row[0])

    async def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        # The relay's heartbeat may be the pool's one connection, waiting behind the very
        # lock this names: asked here, on the hot path's own.
        rows = await self._run(compiled(q.PG_STUCK_TRANSACTIONS), stuck_params(idle_s))
        return [stuck_transaction(row) for row in rows]
