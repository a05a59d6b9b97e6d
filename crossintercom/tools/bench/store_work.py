"""Store work per delivered cross-host message, counted by the PostgreSQL server itself.

Commits: the delta of ``pg_stat_database.xact_commit`` for the store's database over a run of
sequential delivered sends, less what the same relays commit while idle over the same time
(measured just before), less this module's own reads; divided by the messages. Every transaction
counts, read-only ones included. Statements: the delta of ``sum(calls)`` in
``pg_stat_statements`` for the database, transaction control (BEGIN, COMMIT, ROLLBACK) left
out, when the server has it loaded: it needs ``shared_preload_libraries`` and so a restart,
which the bench never does to a server it did not start (``bench --own-postgres`` starts one
with it loaded); else reported as not available, with why. A backend publishes its commit
counts when it goes idle, but no sooner than a second after its last report: one that went idle
right after a burst reports up to 10 s later (PostgreSQL's idle stats interval), so each read
waits that out first. See docs/performance.md.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

# A backend that reported its statistics less than a second before it went idle reports the
# rest 10 s later (PGSTAT_IDLE_INTERVAL): a read sooner misses a burst's last commits.
FLUSH_S = 10.5
# Every committed transaction of the store's database so far.
COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
_IDLE_S = 5.0


class StoreCounters:
    def __init__(self, conninfo: str) -> None:
        self._conn = psycopg.connect(conninfo, autocommit=True)
        self.reads = 0
        row = self._conn.execute(
            "SELECT setting FROM pg_settings WHERE name = 'shared_preload_libraries'"
        ).fetchone()
        loaded = row is not None and "pg_stat_statements" in str(row[0])
        self.statements_why: str | None = None
        if loaded:
            try:
                self._conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            except psycopg.Error as exc:
                loaded, self.statements_why = False, f"pg_stat_statements unusable: {exc}"
        else:
            self.statements_why = (
                "pg_stat_statements is not in shared_preload_libraries (loading it needs a "
                "server restart, which the bench never does; bench --own-postgres starts a "
                "throwaway server that has it)"
            )
        self.statements = loaded

    def close(self) -> None:
        self._conn.close()

    def read(self) -> tuple[int, int | None]:
        """(commits, statements or None) of the store's database so far."""
        self.reads += 1
        row = self._conn.execute(COMMITS).fetchone()
        commits = int(row[0]) if row else 0
        statements = None
        if self.statements:
            self.reads += 1
            srow = self._conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d "
                "ON d.oid = s.dbid WHERE d.datname = current_database() "
                "AND s.query !~* '^\\s*(begin|commit|rollback|start transaction)\\M'"
            ).fetchone()
            statements = int(srow[0]) if srow else 0
        return commits, statements

    def calls(self) -> dict[str, int]:
        """Calls so far of each statement of the store's database (empty without
        pg_stat_statements): two of these apart say what ran in between."""
        if not self.statements:
            return {}
        self.reads += 1
        rows = self._conn.execute(
            "SELECT regexp_replace(s.query, '\\s+', ' ', 'g'), sum(s.calls) "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = current_database() GROUP BY 1"
        ).fetchall()
        return {str(q): int(n) for q, n in rows}

    def sessions(self) -> int:
        """Sessions (connections) opened on the store's database so far: each one's start-up
        transaction is counted in ``xact_commit`` too."""
        self.reads += 1
        row = self._conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0

    def vacuums(self) -> int:
        """Autovacuum and autoanalyze runs so far on the store's tables: their transactions are
        counted in ``xact_commit`` too."""
        self.reads += 1
        row = self._conn.execute(
            "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_user_tables"
        ).fetchone()
        return int(row[0]) if row else 0


async def per_message(
    conninfo: str,
    send: Callable[[int], Awaitable[int]],
    n: int,
    sleep: Callable[[float], Awaitable[None]],
    *,
    relays: int,
) -> dict[str, Any]:
    """Commits (and statements) per delivered message over ``send(n)``, which returns how many
    came back ``delivered``; the idle rate also per relay (``relays`` of them on the store)."""
    counters = StoreCounters(conninfo)
    try:
        await sleep(FLUSH_S)
        c0, s0 = counters.read()
        t0 = time.monotonic()
        await sleep(_IDLE_S)
        c1, s1 = counters.read()
        t1 = time.monotonic()
        idle_rate = max(0, c1 - c0 - 1) / (t1 - t0)
        idle_srate = max(0, (s1 or 0) - (s0 or 0) - 1) / (t1 - t0)
        delivered = await send(n)
        await sleep(FLUSH_S)
        reads_before = counters.reads
        c2, s2 = counters.read()
        t2 = time.monotonic()
        own = counters.reads - reads_before  # this read's own statements count
        busy = max(1, delivered)
        out: dict[str, Any] = {
            "messages": n,
            "delivered": delivered,
            "idle_commits_per_s": round(idle_rate, 2),
            "idle_commits_per_s_per_relay": round(idle_rate / max(1, relays), 2),
            "relays": relays,
            "commits_per_message": round(max(0.0, c2 - c1 - own - idle_rate * (t2 - t1)) / busy, 2),
            "statements_per_message": None,
            "statements_why": counters.statements_why,
            "how": "pg_stat_database.xact_commit delta (and pg_stat_statements calls when "
            "loaded) for the store's database, less the idle rate measured just before",
        }
        if s2 is not None and s1 is not None:
            net = s2 - s1 - own - idle_srate * (t2 - t1)
            out["statements_per_message"] = round(max(0.0, net) / busy, 2)
        return out
    finally:
        counters.close()
