"""The one store: ``SqlStore``, ``MailboxStore`` over the driver port (``storage.driver``),
composed of a ``Dialect`` (PostgreSQL's or SQLite's named alternatives: ``postgres.Postgres``,
``sqlite.Sqlite``), not subclassed by one. Every operation is written once here (hosts,
rosters, path reservations over ``reservations``' row checks, mail, expiry, purge, settings),
or once per dialect where the dialects differ; shared statements are ``queries``'."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy import Connection

from crossintercom.errors import StoreError
from crossintercom.models import SessionInfo, new_id
from crossintercom.reservations import (
    DEFAULT_QUOTAS,
    PER_HOST,
    READ_LIMIT,
    Held,
    Mode,
    Quotas,
    conflicts,
)
from crossintercom.storage import engine as db
from crossintercom.storage import migrate
from crossintercom.storage import queries as q
from crossintercom.storage.archive import SqlArchive
from crossintercom.storage.archive_types import ArchiveStore
from crossintercom.storage.batches import enqueue_batch, stale_enqueue
from crossintercom.storage.driver import Driver, off_loop
from crossintercom.storage.interface import (
    DEFAULT_MAX_PAYLOAD_CHARS,
    Ack,
    Beat,
    Chore,
    EnqueueResult,
    HostRow,
    InboundRow,
    LateReceipt,
    MessageRow,
    OutboundItem,
    QueuedMail,
    ReceiptRow,
    Reserved,
    StoreObserver,
    StoreSettings,
    StuckTransaction,
    Waiter,
)
from crossintercom.storage.reservations import check_quotas, read_live
from crossintercom.storage.rowcheck import (
    age,
    host_report,
    inbound_query,
    inbound_row,
    log_left_out,
    session_info,
    settings_of,
    text_of,
)
from crossintercom.storage.urls import StoreURL
from crossintercom.storage.wakeup import DELIVERIES, RECEIPTS, ROSTER

log = logging.getLogger(__name__)

EXPIRE_BATCH = 1000
# Enqueue checks the size limit against a copy of the settings row at most this old: the row
# changes by operator action only, and reading it in every enqueue cost a round trip.
SETTINGS_TTL_S = 5.0

# Whom a roster hint names: it reaches every host (one channel, one doorbell).
EVERY_HOST = ("",)
# How many of one host's sessions another host reads (setting ``roster_max_per_host``).
ROSTER_PER_HOST = 1000

D = TypeVar("D", bound=Driver)


def utcnow() -> datetime:
    return datetime.now(UTC)


def is_current(conn: Connection, host_id: str, generation: int) -> bool:
    """Whether ``generation`` is the host's current one: the fence of every fenced write."""
    return conn.execute(q.CURRENT_GENERATION, {"host_id": host_id}).scalar() == generation


class Dialect(Protocol):
    """What one backend does its own way, each a named alternative; the store runs the rest.
    ``kind`` is what a wake-up names (wakeup.DELIVERIES, RECEIPTS, or ROSTER: every host's,
    whatever host it names)."""

    name: str
    # fetch_inbound as one statement in autocommit, its session list bound as an array.
    fetch_in_autocommit: bool
    arrays: bool
    # The heartbeat's bump is part of the beat's one statement (else a statement before it).
    beat_in_one_statement: bool
    # The settings row (SQLite's read as bytes and checked).
    read_settings_stmt: Any

    # Wake-ups queued in the transaction, sent at its commit (PostgreSQL's NOTIFY), and those
    # sent once it committed (SQLite's doorbells).
    def notify(self, conn: Connection, host_ids: Collection[str], kind: str) -> None: ...
    def ring(self, host_ids: Collection[str], kind: str) -> None: ...
    def waiter(self, store: SqlStore[Any], host_id: str) -> Waiter: ...
    # Insert roster rows: (the session ids claimed, those left out because another session is
    # inserting them in a transaction still open).
    def claim_sessions(
        self, conn: Connection, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[set[str], set[str]]: ...
    # Serialise the reserves of one project (SQLite's writers are serial already).
    def lock_project(self, conn: Connection, project: str) -> None: ...
    def can_read_archive(self, conn: Connection) -> bool: ...
    async def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]: ...
    def stuck_chore(self, idle_s: float) -> Chore: ...
    async def trust_warnings(self, store: SqlStore[Any]) -> list[str]: ...
    # The delivery path.
    async def enqueue(
        self, store: SqlStore[Any], items: Sequence[OutboundItem], generation: int | None
    ) -> list[EnqueueResult]: ...
    async def ack(
        self, store: SqlStore[Any], host_id: str, generation: int, acks: Sequence[Ack]
    ) -> int: ...
    async def receipts(
        self, store: SqlStore[Any], host_id: str, generation: int, limit: int
    ) -> list[ReceiptRow]: ...
    async def add_receipts(
        self, store: SqlStore[Any], host_id: str, generation: int, receipts: Sequence[LateReceipt]
    ) -> int: ...
    async def consume_receipts(
        self, store: SqlStore[Any], host_id: str, generation: int, receipt_ids: Sequence[int]
    ) -> None: ...


class SqlStore(Generic[D]):
    """``MailboxStore``: each operation one body its driver runs as one transaction
    (``storage.driver``), or its dialect's alternative."""

    def __init__(self, parsed: StoreURL, driver: D, dialect: Dialect) -> None:
        self.parsed = parsed
        self.url_masked = parsed.masked
        self.driver = driver
        self.dialect = dialect
        # Every operation below is one call of this: one transaction, bounded reconnect.
        self.run = driver.run
        # The archive on this same driver: no connection of its own (docs/storage.md).
        self.archive: ArchiveStore = SqlArchive(driver, dialect.name)
        # Whether the heartbeat may carry the archive setting (see beat): asked once.
        self._archive_readable: bool | None = None
        self._settings_lock = threading.Lock()
        self._settings_cache: tuple[float, StoreSettings] | None = None

    async def aclose(self) -> None:
        await self.driver.aclose()

    def observe(self, observer: StoreObserver | None) -> None:
        self.driver.observer = observer

    async def trust_warnings(self) -> list[str]:
        return await self.dialect.trust_warnings(self)

    def waiter(self, host_id: str) -> Waiter:
        return self.dialect.waiter(self, host_id)

    async def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        return await self.dialect.stuck_transactions(idle_s)

    def stuck_chore(self, idle_s: float) -> Chore:
        return self.dialect.stuck_chore(idle_s)

    def notify(self, conn: Connection, host_ids: Collection[str], kind: str) -> None:
        if host_ids:
            self.dialect.notify(conn, host_ids, kind)

    async def check_schema(self) -> None:
        version = await self.run(migrate.read_revision, retry=False)
        migrate.check_revision(version, self.url_masked)

    # -- hosts ----------------------------------------------------------------------------

    async def claim_host(
        self, host_id: str, machine: str | None = None, version: str | None = None
    ) -> int:
        stmt = q.claim_host(self.dialect.name)

        def write(conn: Connection) -> int:
            generation = int(conn.execute(stmt, {"host_id": host_id}).scalar_one())
            if machine is not None or version is not None:
                params = {"host": host_id, "gen": generation, "machine": machine}
                conn.execute(q.SET_HOST_CLAIM, params | {"version": version})
            return generation

        return await self.run(write)

    async def host_claim(self, host_id: str) -> tuple[str | None, int] | None:
        def read(conn: Connection) -> tuple[str | None, int] | None:
            row = conn.execute(q.HOST_CLAIM, {"host_id": host_id}).one_or_none()
            return (row[0], int(row[1])) if row is not None else None

        return await self.run(read, single_statement=True)

    async def queued_through(self, host_id: str) -> int:
        def read(conn: Connection) -> int:
            return int(conn.execute(q.QUEUED_THROUGH, {"host_id": host_id}).scalar_one())

        return await self.run(read, single_statement=True)

    async def heartbeat(self, host_id: str, generation: int) -> bool:
        # A counter bump fenced by generation: repeating it after a lost connection is harmless.
        params = {"host": host_id, "gen": generation}
        return await self.run(
            lambda c: c.execute(q.HEARTBEAT, params).rowcount == 1, single_statement=True
        )

    async def beat(
        self,
        host_id: str,
        generation: int,
        session_ids: Sequence[str],
        chores: Sequence[Chore] = (),
    ) -> Beat | None:
        params = {"host": host_id, "gen": generation, **q.sessions_param(list(session_ids))}
        if self._archive_readable is None:
            self._archive_readable = await self.run(self.dialect.can_read_archive, retry=False)
        stmt = q.beat(self.dialect.name, archive=self._archive_readable)
        in_one = self.dialect.beat_in_one_statement

        def one(conn: Connection) -> Beat | None:
            if not in_one and conn.execute(q.HEARTBEAT, params).rowcount != 1:
                return None
            with db.unprepared(conn):  # once every heartbeat_s: planning it costs less
                rows = conn.execute(stmt, params).all()
            if not rows or not rows[0][7]:
                return None
            hosts = tuple(HostRow(*row[:4]) for row in rows)
            # No row: off. Not readable (a per-host role): not known, so None.
            archive = bool(rows[0][6]) if self._archive_readable else None
            done = tuple(chore.fn(conn) for chore in chores)
            return Beat(hosts, bool(rows[0][4]), bool(rows[0][5]), archive, done)

        afters = [c.after for c in chores if c.after is not None]

        def after() -> None:
            for a in afters:
                a()

        # PostgreSQL: one statement, the bump inside it (harmless to repeat after a lost
        # connection); SQLite, or with chores: bump, read and chores in one transaction.
        single = in_one and not chores
        return await self.run(one, single_statement=single, after=after if afters else None)

    async def hosts(self, *, reports: bool = False) -> list[HostRow]:
        stmt = q.host_reports(self.dialect.name) if reports else q.LIST_HOSTS

        def read(conn: Connection) -> list[HostRow]:
            return [
                HostRow(
                    host,
                    gen,
                    beat,
                    rev,
                    age(beat_at, now),
                    host_report(*told, age=partial(age, now=now)) if reports else None,
                )
                for host, gen, beat, rev, beat_at, now, *told in conn.execute(stmt)
            ]

        return await self.run(read, single_statement=True)

    async def record_error(self, host_id: str, generation: int, code: str, error: str) -> bool:
        params = {"host": host_id, "gen": generation, "code": code, "last_error": error}
        return await self.run(
            lambda c: c.execute(q.SET_HOST_ERROR, params).rowcount == 1, single_statement=True
        )

    async def queued_mail(self, host_id: str | None = None) -> list[QueuedMail]:
        return await self.run(partial(_queued_mail, host_id=host_id), single_statement=True)

    def counts_chore(self, host_id: str, generation: int) -> Chore:
        params = {"host": host_id, "gen": generation, "now": datetime.now(UTC)}

        def read(conn: Connection) -> tuple[list[QueuedMail], dict[str, int]]:
            counts = conn.execute(q.RESERVATION_COUNTS, params)
            by_mode = {str(mode): int(n) for mode, n in counts}
            return _queued_mail(conn, host_id), by_mode

        return Chore(read)

    # -- roster ---------------------------------------------------------------------------

    async def publish_sessions(
        self, host_id: str, generation: int, sessions: Sequence[SessionInfo]
    ) -> bool:
        rows = [
            {
                "host_id": host_id,
                "session_id": s.id,
                "name": s.name,
                "cwd": s.cwd,
                "model": s.model,
                "status": s.status,
                "purpose": s.purpose,
                "groups": list(s.groups),
                "durable": s.durable,
                "online": s.online,
                "wake": None if s.wake == "every" else s.wake,
            }
            for s in sessions
        ]

        published = [False]
        waiting: set[str] = set()

        def write(conn: Connection) -> bool:
            # The revision bump is the fence (see BUMP_ROSTER_REV) and tells the other relays.
            if conn.execute(q.BUMP_ROSTER_REV, {"host": host_id, "gen": generation}).rowcount != 1:
                return False
            conn.execute(q.DELETE_ROSTER, {"host_id": host_id})
            waiting.clear()
            if rows:
                claimed, held = self.dialect.claim_sessions(conn, rows)
                waiting.update(held)
                taken = {s.id for s in sessions} - claimed - held
                if taken:
                    log.warning(
                        "session ids already claimed by another host in the store were not "
                        'published (docs/operations.md, "Trust model")',
                        extra={"host": host_id, "sessions": sorted(taken)},
                    )
            self.dialect.notify(conn, EVERY_HOST, ROSTER)
            published[0] = True
            return True

        def hint() -> None:
            if published[0]:
                self.dialect.ring(EVERY_HOST, ROSTER)

        ok = await self.run(write, after=hint)
        if ok and waiting:
            # Published but for these: the caller publishes again (the relay, at its next beat).
            raise StoreError(
                f"{len(waiting)} session id(s) of this host are being claimed in another "
                "session's open transaction and were left out; the other sessions were "
                'published (docs/operations.md, "Per-host roles")'
            )
        return ok

    async def roster(self, per_host: int = ROSTER_PER_HOST) -> list[SessionInfo]:
        """Every host's sessions, each host's first ``per_host`` only (by session id): rows
        past that, or that no broker would have let a session publish, are left out and
        logged."""

        def read(conn: Connection) -> list[SessionInfo]:
            out, bad, over = [], [], set()
            for r in conn.execute(q.LIST_ROSTER, {"per_host": per_host}):
                if int(r.host_rows) > per_host:
                    over.add(f"{r.host_id!r:.80}")
                info = session_info(r._mapping)
                if info is None:
                    # Named, not quoted whole: a writer's key may be megabytes long.
                    bad.append(f"{r.session_id!r:.80}@{r.host_id!r:.80}")
                else:
                    out.append(info)
            log_left_out(
                log,
                "roster",
                "values of the wrong type, not JSON or over their bounds",
                bad,
                "sessions",
                over,
                per_host,
                "roster_max_per_host",
            )
            return out

        return await self.run(read, single_statement=True)

    # -- path reservations (docs/agents.md#path-reservations; ``reservations``) ----------

    async def reserve(
        self,
        host_id: str,
        generation: int,
        *,
        project: str,
        session_id: str,
        globs: Sequence[str],
        mode: Mode,
        ttl_s: float,
        reason: str | None,
        lapsed: Collection[str] = (),
        quotas: Quotas = DEFAULT_QUOTAS,
    ) -> Reserved | None:
        """Reserve ``globs`` for ``session_id`` of ``host_id``, all or none: refused (nothing
        written) when another session's live reservation clashes, ``QuotaExceeded`` past the
        session's or the host's ``quotas``. None for a stale ``generation``. Reserving a glob
        the session holds renews it (mode, TTL, reason)."""
        unique = list(dict.fromkeys(globs))

        def check(held: list[Held]) -> list[Held]:
            return conflicts(held, session_id, unique, mode, host_id)

        # The glob work, first over the rows as they are now, outside the transaction and in a
        # thread: inside it (holding the project's lock) only rows made since are compared. A
        # row's glob and mode never change (renewing makes a new row), so an id compared once
        # stays compared.
        before, _ = await self.reservation_page(project, lapsed=lapsed, per_host=quotas.per_host)
        seen = {h.id for h in before}
        clashed = {h.id for h in await asyncio.to_thread(check, before)}

        def write(conn: Connection) -> Reserved | None:
            self.dialect.lock_project(conn, project)
            if not is_current(conn, host_id, generation):
                return None
            live, _ = read_live(
                conn, self.dialect.name, project, lapsed=lapsed, per_host=quotas.per_host
            )
            new = [h for h in live if h.id not in seen]
            # Off the event loop too (the relay's heartbeat must not wait on it).
            fresh = {h.id for h in off_loop(lambda: check(new))} if new else set()
            clash = [h for h in live if h.id in clashed or h.id in fresh]
            if not clash:
                now = datetime.now(UTC)
                base = {"project": project, "host_id": host_id, "session_id": session_id}
                check_quotas(conn, quotas, unique, reason, {**base, "now": now})
                conn.execute(q.DROP_SAME_RESERVATIONS, {**base, "globs": unique})
                rows = [
                    {
                        **base,
                        "id": new_id(),
                        "glob": g,
                        "mode": mode,
                        "reason": reason,
                        "created": now,
                        "expires_at": now + timedelta(seconds=ttl_s),
                        "generation": generation,
                    }
                    for g in unique
                ]
                conn.execute(q.INSERT_RESERVATION, rows)
                live, _ = read_live(
                    conn, self.dialect.name, project, lapsed=lapsed, per_host=quotas.per_host
                )
            mine = [h for h in live if h.session == session_id and h.host == host_id]
            return Reserved(mine, clash)

        return await self.run(write)

    async def release(
        self,
        host_id: str,
        generation: int,
        *,
        project: str,
        session_id: str,
        globs: Sequence[str] | None,
    ) -> int | None:
        """Drop the session's reservations of ``project`` (``globs`` None: all); how many went,
        None for a stale ``generation``."""
        params: dict[str, Any] = {"host_id": host_id, "session_id": session_id, "project": project}

        def write(conn: Connection) -> int | None:
            if not is_current(conn, host_id, generation):
                return None
            if globs is None:
                return int(conn.execute(q.RELEASE_ALL_RESERVATIONS, params).rowcount)
            stmt = q.RELEASE_RESERVATIONS
            return int(conn.execute(stmt, {**params, "globs": list(globs)}).rowcount)

        return await self.run(write)

    async def reservations(
        self, project: str | None = None, *, lapsed: Collection[str] = ()
    ) -> list[Held]:
        """The live reservations of ``project`` (None: of every project), oldest first; those
        of hosts in ``lapsed`` left out; at most ``READ_LIMIT`` (``reservation_page``)."""
        found, _ = await self.reservation_page(project, lapsed=lapsed)
        return found

    async def reservation_page(
        self,
        project: str | None = None,
        *,
        lapsed: Collection[str] = (),
        per_host: int = PER_HOST,
        limit: int = READ_LIMIT,
    ) -> tuple[list[Held], bool]:
        """``reservations``, at most ``limit`` and each host's first ``per_host``, and whether
        there were more."""

        def read(conn: Connection) -> tuple[list[Held], bool]:
            return read_live(
                conn, self.dialect.name, project, lapsed=lapsed, per_host=per_host, limit=limit
            )

        return await self.run(read, single_statement=True)

    async def sweep_reservations(self, host_id: str, generation: int) -> int:
        """Delete the host's reservations that no longer count (past their TTL, of an older
        generation, of a session off its roster), fenced; how many went."""
        count: int = await self.run(self.sweep_chore(host_id, generation).fn)
        return count

    def sweep_chore(self, host_id: str, generation: int) -> Chore:
        def write(conn: Connection) -> int:
            if not is_current(conn, host_id, generation):
                return 0
            params = {"host_id": host_id, "generation": generation, "now": datetime.now(UTC)}
            return int(conn.execute(q.SWEEP_RESERVATIONS, params).rowcount)

        return Chore(write)

    # -- messages -------------------------------------------------------------------------

    async def enqueue(
        self, items: Sequence[OutboundItem], *, generation: int | None = None
    ) -> list[EnqueueResult]:
        return await self.dialect.enqueue(self, items, generation)

    def enqueue_in(
        self,
        conn: Connection,
        items: Sequence[OutboundItem],
        generation: int | None,
        woken: set[str] | None = None,
    ) -> list[EnqueueResult]:
        """The batch enqueue's statements (``batches.enqueue_batch``) inside the caller's
        transaction, NOTIFY included, fenced by ``generation`` when given; the hosts to ring
        after the commit are added to ``woken``."""
        sender = items[0].sender_host if items else ""
        if generation is not None and items and not is_current(conn, sender, generation):
            raise stale_enqueue(items, generation)
        limits = self.current_settings(conn)
        results, hosts = enqueue_batch(conn, self.dialect.name, items, limits, utcnow())
        if woken is not None:
            woken.update(hosts)
        self.notify(conn, hosts, DELIVERIES)
        return results

    async def get_message(self, message_id: str) -> MessageRow | None:
        def read(conn: Connection) -> MessageRow | None:
            params = {"message_id": message_id}
            digest = conn.execute(q.MESSAGE_DIGEST, params).scalar()
            if digest is None:
                return None
            states = dict(conn.execute(q.MESSAGE_STATES, params).all())
            return MessageRow(message_id, digest, states)

        return await self.run(read)

    async def fetch_inbound(
        self,
        host_id: str,
        generation: int,
        *,
        limit: int = 500,
        session_ids: Collection[str] | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD_CHARS,
        skip_seqs: Collection[int] = (),
    ) -> list[InboundRow]:
        if session_ids is not None and not session_ids:
            return []
        stmt, params = inbound_query(
            host_id,
            generation,
            limit,
            session_ids,
            max_payload,
            self.dialect.arrays,
            raw_payload=self.dialect.name == "sqlite",
            skip_seqs=skip_seqs,
        )
        rows = await self.run(
            lambda c: c.execute(stmt, params).all(),
            single_statement=self.dialect.fetch_in_autocommit,
        )
        return [inbound_row(*row, max_payload=max_payload) for row in rows]

    async def ack(self, host_id: str, generation: int, acks: Sequence[Ack]) -> int:
        return await self.dialect.ack(self, host_id, generation, acks)

    def write_receipts(
        self, conn: Connection, seqs: list[int], now: datetime, woken: set[str]
    ) -> None:
        """Receipts for deliveries this transaction just finished; wakes their senders."""
        senders = conn.execute(
            q.receipts_for_finished(self.dialect.name), {"created": now, "seqs": seqs}
        )
        woken.update(h for h in map(text_of, senders.scalars()) if h is not None)
        self.notify(conn, woken, RECEIPTS)

    async def receipts(
        self, host_id: str, generation: int, *, limit: int = 500
    ) -> list[ReceiptRow]:
        return await self.dialect.receipts(self, host_id, generation, limit)

    async def consume_receipts(
        self, host_id: str, generation: int, receipt_ids: Sequence[int]
    ) -> None:
        if receipt_ids:
            await self.dialect.consume_receipts(self, host_id, generation, receipt_ids)

    async def add_receipts(
        self, host_id: str, generation: int, receipts: Sequence[LateReceipt]
    ) -> int:
        return await self.dialect.add_receipts(self, host_id, generation, receipts)

    async def forget_session(self, host_id: str, generation: int, session_id: str) -> int:
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            if not is_current(conn, host_id, generation):
                return 0
            now = utcnow()
            params = {"host_id": host_id, "session_id": session_id, "finished": now}
            keys = list(conn.execute(q.FORGET_DELIVERIES, params).scalars())
            forgotten = {"host_id": host_id, "session_id": session_id}
            conn.execute(q.DELETE_ROSTER_SESSION, forgotten)
            conn.execute(q.FORGET_RESERVATIONS, forgotten)
            conn.execute(q.BUMP_ROSTER_REV, {"host": host_id, "gen": generation})
            self.dialect.notify(conn, EVERY_HOST, ROSTER)
            if keys:
                self.write_receipts(conn, keys, now, woken)
            return len(keys)

        def hints() -> None:
            self.dialect.ring(woken, RECEIPTS)
            self.dialect.ring(EVERY_HOST, ROSTER)

        return await self.run(write, after=hints)

    async def expire(self) -> int:
        total = 0
        while True:
            chore = self.expire_chore()
            count: int = await self.run(chore.fn, after=chore.after)
            total += count
            if count < EXPIRE_BATCH:
                return total

    def expire_chore(self) -> Chore:
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            now = utcnow()
            params = {"now": now, "finished": now, "limit": EXPIRE_BATCH}
            keys = list(conn.execute(q.EXPIRE_BATCH, params).scalars())
            if keys:
                self.write_receipts(conn, keys, now, woken)
            return len(keys)

        return Chore(write, lambda: self.dialect.ring(woken, RECEIPTS))

    async def purge(self, *, batch: int = 1000, older_than_s: float | None = None) -> int:
        """Delete finished deliveries (and then-orphaned messages) in bounded transactions.

        Finished rows are kept for ``older_than_s`` (default: the store's retention) because
        they are the dedup record a sender's retry of the same id is answered from.
        """
        keep = (await self.settings()).retention_s if older_than_s is None else older_than_s
        total = 0
        while True:
            found: tuple[int, int] = await self.run(self.purge_chore(keep, batch).fn)
            done, receipts = found
            total += done + receipts
            if done < batch and receipts < batch:
                return total

    def purge_chore(self, older_than_s: float, batch: int = 1000) -> Chore:
        def one_batch(conn: Connection) -> tuple[int, int]:
            params = {"cutoff": utcnow() - timedelta(seconds=older_than_s), "limit": batch}
            ids = conn.execute(q.purge_deliveries(self.dialect.name), params).scalars().all()
            # SQLite: as bytes (a writer's message id that is not UTF-8 failed every
            # purge); such a row's message is left, a row its writer can delete.
            texts = {t for t in map(text_of, ids) if t is not None}
            if texts:
                conn.execute(q.PURGE_ORPHAN_MESSAGES, {"message_ids": list(texts)})
            return len(ids), int(conn.execute(q.PURGE_RECEIPTS, params).rowcount)

        return Chore(one_batch)

    # -- settings -------------------------------------------------------------------------

    def _read_settings(self, conn: Connection) -> StoreSettings:
        """The settings row (none: the defaults), kept for reuse; a value that is not a whole
        number in its column's range (a writer of a SQLite file) is left at its default."""
        found, bad = settings_of(conn.execute(self.dialect.read_settings_stmt).one_or_none())
        if bad:
            log.warning(
                "store settings %s are not whole numbers in range: their defaults are used "
                '(docs/operations.md, "Trust model")',
                ", ".join(bad),
            )
        with self._settings_lock:
            self._settings_cache = (time.monotonic(), found)
        return found

    def fresh_settings(self) -> StoreSettings | None:
        """The cached settings while younger than ``SETTINGS_TTL_S`` (another host's change
        is seen within that time), else None: read them again."""
        cached = self._settings_cache
        if cached is not None and time.monotonic() - cached[0] < SETTINGS_TTL_S:
            return cached[1]
        return None

    def current_settings(self, conn: Connection) -> StoreSettings:
        """The settings, read through ``conn`` only when the cached copy is stale."""
        return self.fresh_settings() or self._read_settings(conn)

    async def cached_settings(self) -> StoreSettings:
        """The settings, read in a statement of their own only when the copy is stale."""
        found = self.fresh_settings()
        if found is None:
            found = await self.run(self._read_settings, single_statement=True)
        return found

    async def settings(self) -> StoreSettings:
        return await self.run(self._read_settings, single_statement=True)

    async def update_settings(
        self, *, max_message_bytes: int | None = None, retention_s: int | None = None
    ) -> None:
        """Change the store-wide limits (an operator action, not a relay one)."""
        values: dict[str, Any] = {}
        if max_message_bytes is not None:
            values["max_message_bytes"] = max_message_bytes
        if retention_s is not None:
            values["retention_s"] = retention_s
        if values:
            await self.run(lambda c: c.execute(q.update_settings(values)))
            with self._settings_lock:
                self._settings_cache = None  # this store sees its own change at once


def _queued_mail(conn: Connection, host_id: str | None) -> list[QueuedMail]:
    """Mail waiting for ``host_id`` (every host when None), one grouped read."""
    params = {"host": host_id} if host_id is not None else {}
    rows = conn.execute(q.queued_mail(host_id is not None), params)
    return [QueuedMail(host, int(n), age(oldest, now)) for host, n, oldest, now in rows]
