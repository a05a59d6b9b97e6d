"""Path reservations in the shared store (docs/agents.md#path-reservations): the store is the
authority. A reserve is one transaction that serialises on its project (an advisory lock on
PostgreSQL; SQLite's writers are serial), reads the project's live reservations, decides in
Python (``crossintercom.reservations``, in a thread, over the rows not compared before the
transaction) and inserts fenced by the host's generation. Every read is bounded and checks
each row another host wrote (``read_live``).

Whether a holder's host is alive is the reader's judgement on its own clock (``lapsed``, from
the relay's lease tracker): the store has no clock all hosts share.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

import msgspec
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from crossintercom.errors import QuotaExceeded, StoreError
from crossintercom.models import Name, new_id
from crossintercom.protocol.client_frames import SessionId
from crossintercom.reservations import (
    DEFAULT_QUOTAS,
    MAX_GLOB,
    MAX_REASON,
    PER_HOST,
    READ_LIMIT,
    Held,
    Mode,
    Quotas,
    conflicts,
)
from crossintercom.safetext import one_line
from crossintercom.storage import queries as q
from crossintercom.storage.driver import off_loop
from crossintercom.storage.engine import lock_timed_out
from crossintercom.storage.hosts import SqlHostStore
from crossintercom.storage.interface import Chore, Reserved
from crossintercom.storage.rowcheck import log_left_out
from crossintercom.storage.tables import HOST_ID_CHARS

log = logging.getLogger(__name__)

# The longest TTL a relay gives (the wire's bound, protocol.Reserve): a row lapsing later was
# not written by a relay, and is not read (queries.live_reservations).
MAX_TTL_S = 30 * 86400


class _Stored(msgspec.Struct, frozen=True):
    """A reservation row's texts as a relay writes them (``reservations.normalise``, the wire's
    bounds); any other value was written by another writer of the store."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    project: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    glob: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_GLOB)]
    mode: Mode
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=HOST_ID_CHARS)]
    session: SessionId
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] | None
    name: Name | None


def _text(value: object) -> object:
    # SQLite's columns come as bytes (queries.live_reservations): text only if UTF-8.
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value
    return value


def _when(value: object) -> float | None:
    """Unix seconds from a stored time: a number (PostgreSQL's epoch) or SQLite's text; None
    for anything else, or a time no reader can hold."""
    value = _text(value)
    if isinstance(value, str):
        try:
            at = datetime.fromisoformat(value)
        except ValueError:
            return None
        seconds = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
    elif isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        seconds = float(value)
    else:
        return None
    return seconds if math.isfinite(seconds) else None


def held_row(row: Sequence[Any]) -> Held | None:
    """One row of ``queries.live_reservations`` as a reservation; None for a row no relay
    would have written (a value of the wrong type, size or encoding, a time that is none)."""
    rid, project, glob, mode, host, session, expires, created, reason, name = row[:10]
    expires_at, made = _when(expires), _when(created)
    if expires_at is None or made is None:
        return None
    try:
        h = msgspec.convert(
            {
                "id": _text(rid),
                "project": _text(project),
                "glob": _text(glob),
                "mode": _text(mode),
                "host": _text(host),
                "session": _text(session),
                "reason": _text(reason),
                "name": _text(name),
            },
            _Stored,
        )
    except msgspec.ValidationError:
        return None
    return Held(
        h.id, h.project, h.glob, h.mode, h.host, h.session, expires_at, made, h.reason, h.name
    )


def read_live(
    conn: Connection,
    dialect: str,
    project: str | None,
    *,
    lapsed: Collection[str] = (),
    per_host: int = PER_HOST,
    limit: int = READ_LIMIT,
) -> tuple[list[Held], bool]:
    """The live reservations of ``project`` (None: every project's), oldest first, those of
    hosts in ``lapsed`` left out; and whether there were more than ``limit``. Bounded whatever
    the store holds: rows no relay would have written are left out and logged, alone, and so
    are a host's rows past ``per_host``."""
    now = datetime.now(UTC)
    params: dict[str, Any] = {
        "now": now,
        "latest": now + timedelta(seconds=MAX_TTL_S + 86400),
        "per_host": per_host,
        "limit": limit + 1,
    }
    if project is not None:
        params["project"] = project
    out, bad, over = [], [], set()
    for row in conn.execute(q.live_reservations(dialect, project is not None), params):
        h = held_row(row)
        if int(row[10]) > per_host:
            over.add(_shown(row[4]))
        if h is None:
            bad.append(f"{_shown(row[0])} of {_shown(row[4])}")
        elif h.host not in lapsed:
            out.append(h)
    log_left_out(
        log,
        "reservation",
        "values of the wrong type, size or encoding, or a time that is none",
        bad,
        "rows",
        over,
        per_host,
        "reservation_max_per_host",
    )
    return out[:limit], len(out) > limit


def _shown(value: object) -> str:
    return repr(_text(value))[:80]


# How long a reserve waits for another reserve of its project. Each holds the lock for a few
# statements; one held longer is a stuck session (or a host role holding it on purpose:
# docs/operations.md, "Per-host roles"), said so instead of waiting out the statement timeout.
PROJECT_LOCK_WAIT_S = 5.0


def _lock_project(conn: Connection, project: str) -> None:
    # The bound stays for the rest of this short transaction (its row locks wait no longer).
    conn.execute(q.PG_SET_LOCK_TIMEOUT, {"ms": str(int(PROJECT_LOCK_WAIT_S * 1000))})
    try:
        conn.execute(q.PG_LOCK_PROJECT, {"project": project})
    except DBAPIError as exc:
        if not lock_timed_out(exc):
            raise
        raise StoreError(
            f"another session has held the reservations of project {one_line(project)!r} for "
            f"over {PROJECT_LOCK_WAIT_S:g} s (a stuck transaction, or a host holding the lock); "
            "nothing was reserved: try again"
        ) from None


class SqlReservations(SqlHostStore):
    """The reservation operations, between the host half and ``SqlMailboxStore``."""

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
            if self.dialect == "postgresql":
                _lock_project(conn, project)
            if not self._is_current(conn, host_id, generation):
                return None
            live, _ = read_live(
                conn, self.dialect, project, lapsed=lapsed, per_host=quotas.per_host
            )
            new = [h for h in live if h.id not in seen]
            # Off the event loop too (the relay's heartbeat must not wait on it).
            fresh = {h.id for h in off_loop(lambda: check(new))} if new else set()
            clash = [h for h in live if h.id in clashed or h.id in fresh]
            if not clash:
                now = datetime.now(UTC)
                base = {"project": project, "host_id": host_id, "session_id": session_id}
                _check_quotas(conn, quotas, unique, reason, {**base, "now": now})
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
                    conn, self.dialect, project, lapsed=lapsed, per_host=quotas.per_host
                )
            mine = [h for h in live if h.session == session_id and h.host == host_id]
            return Reserved(mine, clash)

        return await self._run(write)

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
            if not self._is_current(conn, host_id, generation):
                return None
            if globs is None:
                return int(conn.execute(q.RELEASE_ALL_RESERVATIONS, params).rowcount)
            stmt = q.RELEASE_RESERVATIONS
            return int(conn.execute(stmt, {**params, "globs": list(globs)}).rowcount)

        return await self._run(write)

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
                conn, self.dialect, project, lapsed=lapsed, per_host=per_host, limit=limit
            )

        return await self._run(read, single_statement=True)

    async def sweep_reservations(self, host_id: str, generation: int) -> int:
        """Delete the host's reservations that no longer count (past their TTL, of an older
        generation, of a session off its roster), fenced; how many went."""
        count: int = await self._run(self.sweep_chore(host_id, generation).fn)
        return count

    def sweep_chore(self, host_id: str, generation: int) -> Chore:
        def write(conn: Connection) -> int:
            if not self._is_current(conn, host_id, generation):
                return 0
            params = {"host_id": host_id, "generation": generation, "now": datetime.now(UTC)}
            return int(conn.execute(q.SWEEP_RESERVATIONS, params).rowcount)

        return Chore(write)


def _check_quotas(
    conn: Connection, quotas: Quotas, globs: Sequence[str], reason: str | None, base: dict[str, Any]
) -> None:
    """``QuotaExceeded`` when ``globs`` would take the session or its host past its quota
    (the rows the reserve renews not counted twice)."""
    adding = len(globs)
    chars = sum(len(g) + len(reason or "") for g in globs)
    params = {**base, "renewer": base["session_id"], "globs": list(globs)}
    for whose, session, most, most_chars in (
        ("session", base["session_id"], quotas.per_session, quotas.per_session_chars),
        ("host", None, quotas.per_host, quotas.per_host_chars),
    ):
        count, used = conn.execute(q.RESERVATION_USAGE, {**params, "session_id": session}).one()
        if int(count) + adding > most or int(used) + chars > most_chars:
            raise QuotaExceeded(
                f"not reserved: this {whose} would hold {int(count) + adding} reservations "
                f"({int(used) + chars} characters of globs and reasons); its quota is {most} "
                f"({most_chars} characters). Release some (`crossintercom unreserve`) or "
                "reserve a wider glob"
            )
