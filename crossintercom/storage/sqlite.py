"""SQLite's dialect of the store, for a database file on a (possibly shared) filesystem:
doorbell wake-ups, and the delivery path as the batch statements in one transaction.

The engine (rollback journal, never WAL; ``BEGIN IMMEDIATE`` for writers; busy timeout) and the
file checks live in ``storage.engine``; its driver runs each transaction in a worker thread
(``driver.SqliteDriver``). ``sqlite_store`` makes the store.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from crossintercom.models import SessionInfo
from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage import sqlitetrust
from crossintercom.storage.driver import SqliteDriver
from crossintercom.storage.interface import (
    Ack,
    Chore,
    EnqueueResult,
    LateReceipt,
    OutboundItem,
    ReceiptRow,
    StuckTransaction,
)
from crossintercom.storage.rowcheck import receipt_row, session_info
from crossintercom.storage.sqlstore import ROSTER_PER_HOST, SqlStore, is_current, utcnow
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import (
    DELIVERIES,
    POLL_INTERVAL_S,
    RECEIPTS,
    DoorbellWaiter,
    doorbell_dir,
    polling_needed,
    ring_doorbell,
)

log = logging.getLogger(__name__)

_OBJECTS = "SELECT type, name, sql FROM sqlite_master WHERE type IN ('trigger', 'view')"


def sqlite_store(
    parsed: StoreURL, *, polling_observer: bool | None = None
) -> SqlStore[SqliteDriver]:
    """The store in the file ``parsed`` names. ``polling_observer``: watch the doorbells by
    polling (True), with inotify (False), or as the store's filesystem needs (None: polling
    where it carries no change notifications across machines, ``wakeup.polling_needed``)."""
    dialect = Sqlite(parsed, polling_observer)
    # must_exist: opening a store never creates an empty file; `db upgrade` does.
    return SqlStore(parsed, SqliteDriver(parsed, db.store_engine(parsed, must_exist=True)), dialect)


class Sqlite:
    """SQLite's alternatives (``sqlstore.Dialect``): the batch statements in one transaction
    (``BEGIN IMMEDIATE``: writers are serial), doorbells rung after the commit."""

    name = "sqlite"
    fetch_in_autocommit = False
    arrays = False
    beat_in_one_statement = False
    read_settings_stmt = q.SQLITE_READ_SETTINGS

    def __init__(self, parsed: StoreURL, polling_observer: bool | None) -> None:
        assert parsed.path is not None
        self.path = parsed.path
        fs_type = polling_needed(parsed.path)
        self.polling_observer = (
            fs_type is not None if polling_observer is None else polling_observer
        )
        self.wakeup_note = _wakeup_note(self.polling_observer, polling_observer, fs_type)

    # -- wake-ups: doorbells, rung once the commit happened -------------------------------

    def notify(self, conn: Connection, host_ids: Collection[str], kind: str) -> None:
        """Nothing: the doorbells ring after the commit."""

    def ring(self, host_ids: Collection[str], kind: str) -> None:
        for host_id in host_ids:  # a ROSTER kind rings the one roster doorbell
            try:
                ring_doorbell(self.path, host_id, kind)
            except OSError as exc:
                # The write committed: a doorbell is only a hint, and the recipient's poll
                # backstop finds the row. Failing here would report a committed write as lost.
                log.warning(
                    "doorbell for host %s (%s) not rung: %s; its relay finds the rows by polling",
                    host_id or "every host",
                    kind,
                    exc,
                    extra={"host_id": host_id, "error": str(exc)},
                )

    def waiter(self, store: SqlStore[Any], host_id: str) -> DoorbellWaiter:
        return DoorbellWaiter(self.path, host_id, polling=self.polling_observer)

    # -- locks, rights, stuck sessions ----------------------------------------------------

    def claim_sessions(
        self, conn: Connection, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[set[str], set[str]]:
        return set(conn.execute(q.insert_roster(self.name), rows).scalars()), set()

    def lock_project(self, conn: Connection, project: str) -> None:
        """Nothing: the transaction holds the file's write lock."""

    def can_read_archive(self, conn: Connection) -> bool:
        return True

    async def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        return []  # a held file lock shows as its writers' busy timeouts instead

    def stuck_chore(self, idle_s: float) -> Chore:
        return Chore(lambda _conn: [])

    async def trust_warnings(self, store: SqlStore[Any]) -> list[str]:
        """Triggers and views the schema does not define, files others may use, and the
        doorbells' polling when the relay chose it or was told to (shown in `status`)."""
        rows = await store.run(
            lambda c: [tuple(r) for r in c.exec_driver_sql(_OBJECTS).all()],
            single_statement=True,
        )
        found = sqlitetrust.foreign_objects(rows)
        found += sqlitetrust.loose_modes(self.path, doorbell_dir(self.path))
        return found + ([self.wakeup_note] if self.wakeup_note else [])

    # -- the delivery path, in batches ----------------------------------------------------

    async def enqueue(
        self, store: SqlStore[Any], items: Sequence[OutboundItem], generation: int | None
    ) -> list[EnqueueResult]:
        """The whole batch in one transaction of a constant number of statements
        (``batches.enqueue_batch``); fenced by ``generation`` when given."""
        woken: set[str] = set()

        def write(conn: Connection) -> list[EnqueueResult]:
            woken.clear()  # a retried attempt starts over
            return store.enqueue_in(conn, items, generation, woken)

        return await store.run(write, after=lambda: self.ring(woken, DELIVERIES))

    async def ack(
        self, store: SqlStore[Any], host_id: str, generation: int, acks: Sequence[Ack]
    ) -> int:
        """One UPDATE per distinct (outcome, code) in the batch (usually one), then one
        INSERT … SELECT of the receipts for exactly the rows it changed."""
        woken: set[str] = set()
        # The first ack of a row wins, as it would one by one; the rest change nothing. Rows
        # named by their seq (as read: the relay's acks, whatever a writer stored in their
        # keys) are finished by it, the others by their key.
        by_outcome: dict[tuple[str, str | None, bool], list[Any]] = {}
        seen: set[tuple[str, str] | int] = set()
        for a in acks:
            key = (a.message_id, a.recipient_session) if a.seq is None else a.seq
            if key not in seen:
                seen.add(key)
                by_outcome.setdefault((a.outcome, a.code, a.seq is not None), []).append(key)

        def write(conn: Connection) -> int:
            woken.clear()
            if not acks or not is_current(conn, host_id, generation):
                return 0
            now = utcnow()
            finished: list[int] = []
            for (outcome, code, by_seq), keys in by_outcome.items():
                params = {
                    "host_id": host_id,
                    "new_state": outcome,
                    "new_reason": code,
                    "finished": now,
                    **({"seqs": keys} if by_seq else q.key_params(self.name, keys)),
                }
                changed = conn.execute(q.finish_deliveries(self.name, by_seq), params)
                finished.extend(changed.scalars())
            if finished:
                store.write_receipts(conn, finished, now, woken)
            return len(finished)

        return await store.run(write, after=lambda: self.ring(woken, RECEIPTS))

    async def receipts(
        self, store: SqlStore[Any], host_id: str, generation: int, limit: int
    ) -> list[ReceiptRow]:
        params = {"host_id": host_id, "generation": generation, "limit": limit}
        rows = await store.run(
            lambda c: c.execute(q.SQLITE_LIST_RECEIPTS, params).all(), single_statement=True
        )
        found = [(r[0], receipt_row(r)) for r in rows]
        bad = [rid for rid, row in found if row is None]
        if bad:
            # Never passed on, and deleted now: left, they would fill every later read.
            log.warning(
                "receipts for host %s dropped: a value is not UTF-8 (written by no relay; "
                'docs/operations.md, "Trust model")',
                host_id,
                extra={"ids": bad[:20]},
            )
            await store.consume_receipts(host_id, generation, bad)
        return [row for _, row in found if row is not None]

    async def add_receipts(
        self, store: SqlStore[Any], host_id: str, generation: int, receipts: Sequence[LateReceipt]
    ) -> int:
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            if not receipts or not is_current(conn, host_id, generation):
                return 0
            extra = {"recipient_host": host_id, "created": utcnow()}
            made = conn.execute(q.INSERT_LATE_RECEIPTS, [asdict(r) | extra for r in receipts])
            woken.update(r.sender_host for r in receipts)
            return int(made.rowcount)

        return await store.run(write, after=lambda: self.ring(woken, RECEIPTS))

    async def consume_receipts(
        self, store: SqlStore[Any], host_id: str, generation: int, receipt_ids: Sequence[int]
    ) -> None:
        params = {"host_id": host_id, "receipt_ids": list(receipt_ids)}

        def write(conn: Connection) -> None:
            if is_current(conn, host_id, generation):
                conn.execute(q.DELETE_RECEIPTS, params)

        await store.run(write)


def _wakeup_note(polling: bool, asked: bool | None, fs_type: str | None) -> str | None:
    """How the doorbells are watched, for `status`, where it is not the default inotify."""
    if polling and asked is None:
        return (
            f"doorbells polled every {POLL_INTERVAL_S} s: the store is on {fs_type}, which "
            "carries no change notifications across machines (--no-polling-observer to watch "
            'with inotify; docs/operations.md, "Shared filesystems")'
        )
    if polling:
        return f"doorbells polled every {POLL_INTERVAL_S} s (--polling-observer)"
    if fs_type is not None:
        return (
            f"WARNING doorbells watched with inotify on {fs_type} (--no-polling-observer): "
            "writes from other machines wake this relay only at its heartbeat's poll"
        )
    return None


def roster_without_locks(path: Path) -> list[SessionInfo]:
    """The roster as the file holds it, read without taking a single lock (``immutable``): for
    a relay whose filesystem's locks do not exclude (storage/lockcheck.py), which must not
    even read the store the usual way, since a reader that takes a live writer's journal for
    a crashed one's rolls it back into the file. The read may be torn: rows that do not parse
    are left out, and a file that does not read at all gives none."""
    uri = f"sqlite:///{path.resolve().as_uri()}?mode=ro&immutable=1&uri=true"
    engine = create_engine(uri, poolclass=NullPool)
    out = []
    try:
        with engine.connect() as conn:
            for row in conn.execute(q.LIST_ROSTER, {"per_host": ROSTER_PER_HOST}):
                info = session_info(row._mapping)
                if info is not None:
                    out.append(info)
    except SQLAlchemyError as exc:
        log.warning("the roster could not be read from %s: %s", path, exc)
    finally:
        engine.dispose()
    return out
