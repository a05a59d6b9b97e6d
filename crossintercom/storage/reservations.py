"""Path reservations in the shared store (docs/agents.md#path-reservations): the store is the
authority. A reserve is one transaction that serialises on its project (an advisory lock on
PostgreSQL; SQLite's writers are serial), reads the project's live reservations, decides in
Python (``crossintercom.reservations``) and inserts fenced by the host's generation.

Whether a holder's host is alive is the reader's judgement on its own clock (``lapsed``, from
the relay's lease tracker): the store has no clock all hosts share.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from crossintercom.errors import StoreError
from crossintercom.models import new_id
from crossintercom.reservations import Held, Mode, conflicts
from crossintercom.safetext import one_line
from crossintercom.storage import queries as q
from crossintercom.storage.engine import lock_timed_out
from crossintercom.storage.hosts import SqlHostStore
from crossintercom.storage.interface import Reserved

log = logging.getLogger(__name__)


def _held(row: Sequence[Any]) -> Held:
    rid, project, glob, mode, host, session, expires, created, reason, name = row
    return Held(rid, project, glob, mode, host, session, _ts(expires), _ts(created), reason, name)


def _ts(value: datetime) -> float:
    # SQLite hands back naive datetimes of what was stored in UTC.
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


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

    def _live(self, conn: Connection, project: str | None, lapsed: Collection[str]) -> list[Held]:
        now = datetime.now(UTC)
        if project is None:
            rows = conn.execute(q.ALL_LIVE_RESERVATIONS, {"now": now})
        else:
            rows = conn.execute(q.LIVE_RESERVATIONS, {"now": now, "project": project})
        return [h for h in map(_held, rows) if h.host not in lapsed]

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
    ) -> Reserved | None:
        """Reserve ``globs`` for ``session_id`` of ``host_id``, all or none: refused (nothing
        written) when another session's live reservation clashes. None for a stale
        ``generation``. Reserving a glob the session holds renews it (mode, TTL, reason)."""

        def write(conn: Connection) -> Reserved | None:
            if self.dialect == "postgresql":
                _lock_project(conn, project)
            if not self._is_current(conn, host_id, generation):
                return None
            live = self._live(conn, project, lapsed)
            clash = conflicts(live, session_id, globs, mode)
            if not clash:
                now = datetime.now(UTC)
                base = {"project": project, "session_id": session_id}
                conn.execute(q.DROP_SAME_RESERVATIONS, {**base, "globs": list(globs)})
                rows = [
                    {
                        **base,
                        "id": new_id(),
                        "glob": g,
                        "mode": mode,
                        "reason": reason,
                        "created": now,
                        "expires_at": now + timedelta(seconds=ttl_s),
                        "host_id": host_id,
                        "generation": generation,
                    }
                    for g in dict.fromkeys(globs)
                ]
                conn.execute(q.INSERT_RESERVATION, rows)
                live = self._live(conn, project, lapsed)
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
        of hosts in ``lapsed`` left out."""
        return await self._run(lambda c: self._live(c, project, lapsed), single_statement=True)

    async def sweep_reservations(self, host_id: str, generation: int) -> int:
        """Delete the host's reservations that no longer count (past their TTL, of an older
        generation, of a session off its roster), fenced; how many went."""
        params = {"host_id": host_id, "generation": generation, "now": datetime.now(UTC)}

        def write(conn: Connection) -> int:
            if not self._is_current(conn, host_id, generation):
                return 0
            return int(conn.execute(q.SWEEP_RESERVATIONS, params).rowcount)

        return await self._run(write)
