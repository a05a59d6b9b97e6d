"""The host half of the store and the plumbing both halves run on: the driver that runs each
operation, the backends' wake-up hooks, the schema check, host claims, heartbeats and rosters.
Messages, receipts and settings are ``sqlstore``'s."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any

import msgspec
from sqlalchemy import Connection, RowMapping
from sqlalchemy.exc import DBAPIError

from crossintercom.errors import StoreError
from crossintercom.models import (
    MAX_GROUPS,
    Cwd,
    Description,
    Name,
    Purpose,
    SessionInfo,
    WakePolicy,
)
from crossintercom.protocol.client_frames import SessionId
from crossintercom.storage import migrate
from crossintercom.storage import queries as q
from crossintercom.storage.archive import SqlArchive
from crossintercom.storage.archive_types import ArchiveStore
from crossintercom.storage.driver import Driver
from crossintercom.storage.engine import lock_timed_out
from crossintercom.storage.interface import (
    Beat,
    Chore,
    HostRow,
    QueuedMail,
    StoreObserver,
    Waiter,
)
from crossintercom.storage.rowcheck import host_report, log_left_out
from crossintercom.storage.tables import HOST_ID_CHARS
from crossintercom.storage.urls import StoreURL

log = logging.getLogger(__name__)

# How many of one host's sessions another host reads (setting ``roster_max_per_host``).
ROSTER_PER_HOST = 1000
# How long a roster publish waits on a session id another session is inserting (ms).
CLAIM_WAIT_MS = 200


def _insert_unless_waiting(
    conn: Connection, insert: Any, rows: Sequence[Mapping[str, Any]]
) -> set[str] | None:
    """The session ids ``insert`` claimed for ``rows`` (in a savepoint), or None when it waited
    out the transaction's lock timeout (and undid only that)."""
    try:
        with conn.begin_nested():
            return set(conn.execute(insert, rows).scalars())
    except DBAPIError as exc:
        if not lock_timed_out(exc):
            raise
    return None


class SqlHostStore:
    """Hosts and rosters, each operation one body its backend's driver runs as one transaction
    (``storage.driver``). Subclasses supply the driver, locking and wake-ups."""

    dialect: str
    skip_locked: bool
    # fetch_inbound as one statement in autocommit, its session list bound as an array.
    fetch_in_autocommit = False
    arrays = False

    def __init__(self, parsed: StoreURL, driver: Driver) -> None:
        self.parsed = parsed
        self.url_masked = parsed.masked
        self.driver = driver
        # Every operation below is one call of this: one transaction, bounded reconnect.
        self._run = driver.run
        # The archive on this same driver: no connection of its own (docs/storage.md).
        self.archive: ArchiveStore = SqlArchive(driver, self.dialect)
        # Whether the heartbeat may carry the archive setting (see beat): asked once.
        self._archive_readable: bool | None = None

    async def aclose(self) -> None:
        await self.driver.aclose()

    def observe(self, observer: StoreObserver | None) -> None:
        self.driver.observer = observer

    # Backend hooks: how wake-ups are sent; ``kind`` is what they name (wakeup.DELIVERIES or
    # wakeup.RECEIPTS).
    def _notify_in_txn(self, conn: Connection, host_ids: Collection[str], kind: str) -> None:
        """Queue wake-ups that are sent on commit (Postgres NOTIFY)."""

    def _after_commit(self, host_ids: Collection[str], kind: str) -> None:
        """Send wake-ups that need the commit to have happened (SQLite doorbells)."""

    def _notify_roster_in_txn(self, conn: Connection) -> None:
        """Queue the roster hint to every host, sent on commit (Postgres NOTIFY)."""

    def _after_roster_commit(self) -> None:
        """Send the roster hint to every host once the commit happened (SQLite doorbell)."""

    # -- schema ---------------------------------------------------------------------------

    async def check_schema(self) -> None:
        version = await self._run(migrate.read_revision, retry=False)
        migrate.check_revision(version, self.url_masked)

    # -- hosts ----------------------------------------------------------------------------

    async def claim_host(
        self, host_id: str, machine: str | None = None, version: str | None = None
    ) -> int:
        stmt = q.claim_host(self.dialect)

        def write(conn: Connection) -> int:
            generation = int(conn.execute(stmt, {"host_id": host_id}).scalar_one())
            if machine is not None or version is not None:
                params = {"host": host_id, "gen": generation, "machine": machine}
                conn.execute(q.SET_HOST_CLAIM, params | {"version": version})
            return generation

        return await self._run(write)

    async def host_claim(self, host_id: str) -> tuple[str | None, int] | None:
        def read(conn: Connection) -> tuple[str | None, int] | None:
            row = conn.execute(q.HOST_CLAIM, {"host_id": host_id}).one_or_none()
            return (row[0], int(row[1])) if row is not None else None

        return await self._run(read, single_statement=True)

    async def queued_through(self, host_id: str) -> int:
        def read(conn: Connection) -> int:
            return int(conn.execute(q.QUEUED_THROUGH, {"host_id": host_id}).scalar_one())

        return await self._run(read, single_statement=True)

    async def heartbeat(self, host_id: str, generation: int) -> bool:
        # A counter bump fenced by generation: repeating it after a lost connection is harmless.
        params = {"host": host_id, "gen": generation}
        return await self._run(
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
            self._archive_readable = await self._run(self._can_read_archive, retry=False)
        stmt = q.beat(self.dialect, archive=self._archive_readable)

        def one(conn: Connection) -> Beat | None:
            if self.dialect != "postgresql" and conn.execute(q.HEARTBEAT, params).rowcount != 1:
                return None
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
        single = self.dialect == "postgresql" and not chores
        return await self._run(one, single_statement=single, after=after if afters else None)

    def stuck_chore(self, idle_s: float) -> Chore:
        return Chore(lambda _conn: [])  # SQLite: a held file lock shows as busy timeouts

    def _can_read_archive(self, conn: Connection) -> bool:
        if self.dialect != "postgresql":
            return True
        return bool(conn.execute(q.PG_ARCHIVE_READABLE).scalar())

    async def hosts(self, *, reports: bool = False) -> list[HostRow]:
        stmt = q.host_reports(self.dialect) if reports else q.LIST_HOSTS

        def read(conn: Connection) -> list[HostRow]:
            return [
                HostRow(
                    host,
                    gen,
                    beat,
                    rev,
                    _age(beat_at, now),
                    host_report(*told, age=partial(_age, now=now)) if reports else None,
                )
                for host, gen, beat, rev, beat_at, now, *told in conn.execute(stmt)
            ]

        return await self._run(read, single_statement=True)

    async def record_error(self, host_id: str, generation: int, code: str, error: str) -> bool:
        params = {"host": host_id, "gen": generation, "code": code, "last_error": error}
        return await self._run(
            lambda c: c.execute(q.SET_HOST_ERROR, params).rowcount == 1, single_statement=True
        )

    async def queued_mail(self, host_id: str | None = None) -> list[QueuedMail]:
        stmt = q.queued_mail(host_id is not None)
        params = {"host": host_id} if host_id is not None else {}

        def read(conn: Connection) -> list[QueuedMail]:
            return [
                QueuedMail(host, int(n), _age(oldest, now))
                for host, n, oldest, now in conn.execute(stmt, params)
            ]

        return await self._run(read, single_statement=True)

    async def reservation_counts(self, host_id: str, generation: int) -> dict[str, int]:
        params = {"host": host_id, "gen": generation, "now": datetime.now(UTC)}

        def read(conn: Connection) -> dict[str, int]:
            return {str(mode): int(n) for mode, n in conn.execute(q.RESERVATION_COUNTS, params)}

        return await self._run(read, single_statement=True)

    @staticmethod
    def _is_current(conn: Connection, host_id: str, generation: int) -> bool:
        return conn.execute(q.CURRENT_GENERATION, {"host_id": host_id}).scalar() == generation

    def _notify(self, conn: Connection, host_ids: Collection[str], kind: str) -> None:
        if host_ids:
            self._notify_in_txn(conn, host_ids, kind)

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
                claimed, held = self._claim_sessions(conn, rows)
                waiting.update(held)
                taken = {s.id for s in sessions} - claimed - held
                if taken:
                    log.warning(
                        "session ids already claimed by another host in the store were not "
                        'published (docs/operations.md, "Trust model")',
                        extra={"host": host_id, "sessions": sorted(taken)},
                    )
            self._notify_roster_in_txn(conn)
            published[0] = True
            return True

        def hint() -> None:
            if published[0]:
                self._after_roster_commit()

        ok = await self._run(write, after=hint)
        if ok and waiting:
            # Published but for these: the caller publishes again (the relay, at its next beat).
            raise StoreError(
                f"{len(waiting)} session id(s) of this host are being claimed in another "
                "session's open transaction and were left out; the other sessions were "
                'published (docs/operations.md, "Per-host roles")'
            )
        return ok

    def _claim_sessions(
        self, conn: Connection, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[set[str], set[str]]:
        """Insert the roster rows: (the session ids claimed, those left out because another
        session is inserting them in a transaction still open). On PostgreSQL such a row would
        wait for that transaction (the unique index) with this host's row locked, so a host role
        could stall the whole publish; it is left out after a short wait instead, and the others
        go in (docs/operations.md, "Per-host roles")."""
        insert = q.insert_roster(self.dialect)
        if self.dialect != "postgresql":
            return set(conn.execute(insert, rows).scalars()), set()
        conn.execute(q.PG_SET_LOCK_TIMEOUT, {"ms": str(CLAIM_WAIT_MS)})
        claimed = _insert_unless_waiting(conn, insert, rows)
        if claimed is not None:
            return claimed, set()
        claimed, held = set(), set()
        conn.execute(q.PG_SET_LOCK_TIMEOUT, {"ms": str(CLAIM_WAIT_MS // 5)})
        for row in rows:
            one = _insert_unless_waiting(conn, insert, [row])
            if one is None:
                held.add(str(row["session_id"]))
            else:
                claimed |= one
        return claimed, held

    async def roster(self, per_host: int = ROSTER_PER_HOST) -> list[SessionInfo]:
        """Every host's sessions, each host's first ``per_host`` only (by session id): rows
        past that, or that no broker would have let a session publish, are left out and
        logged."""

        def read(conn: Connection) -> list[SessionInfo]:
            out, bad, over = [], [], set()
            for r in conn.execute(q.LIST_ROSTER, {"per_host": per_host}):
                if int(r.host_rows) > per_host:
                    over.add(f"{r.host_id!r:.80}")
                info = _session_info(r._mapping)
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

        return await self._run(read, single_statement=True)

    def waiter(self, host_id: str) -> Waiter:
        raise NotImplementedError


class _Published(msgspec.Struct, frozen=True):
    """A roster row as a broker lets a session describe itself: names as registered, every
    field bounded (a host may publish anything in its own rows, and every `list` answer on
    every host carries them; docs/protocol.md)."""

    id: SessionId
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=HOST_ID_CHARS)]
    name: Name | None
    cwd: Cwd | None
    model: Description | None
    status: Description | None
    purpose: Purpose
    groups: Annotated[tuple[Name, ...], msgspec.Meta(max_length=MAX_GROUPS)]
    durable: bool
    online: bool
    wake: WakePolicy


def _session_info(r: RowMapping) -> SessionInfo | None:
    """One roster row as a session, every value checked (SQLite keeps whatever a writer of the
    file stored, of any type); None for a row no relay would have written."""
    groups = r["groups"]
    try:
        if isinstance(groups, str | bytes):
            groups = msgspec.json.decode(groups)
        published = msgspec.convert(
            {
                "id": r["session_id"],
                "host": r["host_id"],
                "name": r["name"],
                "cwd": r["cwd"],
                "model": r["model"],
                "status": r["status"],
                "purpose": r["purpose"],
                "groups": groups,
                "durable": r["durable"],
                "online": r["online"],
                "wake": r["wake"] if r["wake"] in ("asks", "urgent", "never") else "every",
            },
            _Published,
        )
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return SessionInfo(**msgspec.structs.asdict(published))


def _age(then: datetime | str | None, now: datetime | None) -> float | None:
    """Seconds from ``then`` to ``now``, both the database's (SQLite's come without a zone:
    UTC, as CURRENT_TIMESTAMP writes them, and as text: None when a writer stored another)."""
    if isinstance(then, str):
        try:
            then = datetime.fromisoformat(then)
        except ValueError:
            return None
    if not isinstance(then, datetime) or now is None:
        return None
    then, now = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (then, now))
    return max(0.0, (now - then).total_seconds())
