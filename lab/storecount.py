"""Statements and commits per delivered cross-host message, and idle commits per relay, on a
throwaway PostgreSQL cluster with ``pg_stat_statements`` loaded (docs/perf-log/2026-12.md, "Store
path reshaped").

``python -m lab.storecount [N]``: starts the cluster (``tools.pgcluster``, with
the extension loaded and fsync on, which the shared server never is), two simulated hosts with
their relays, a listener on the second, and sends N (default 200) sequential messages from the
first; the counts are ``bench.store_work``'s. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from crossintercom.client import AsyncClient
from crossintercom.storage import migrate
from crossintercom.tools.bench import paths
from crossintercom.tools.bench.store_work import COMMITS, FLUSH_S, per_message
from crossintercom.tools.harness import BULK_SENDER, Cluster, SimHost
from crossintercom.tools.pgcluster import ThrowawayPostgres

HOSTS = ("count-alpha", "count-beta")
SINK = "sink0"
# Idle is measured over this long, after the server published the busy counts.
IDLE_S = 10.0


async def _count(alpha: SimHost, beta: SimHost, conninfo: str, n: int) -> dict[str, Any]:
    sender = AsyncClient(alpha.settings, alpha.identity("count-sender", cwd="/"))
    await sender.connect()
    try:
        await paths.sequential(sender, beta, SINK, 10)  # warm-up

        async def send(k: int) -> int:
            seq = await paths.sequential(sender, beta, SINK, k)
            return seq.outcomes["delivered"]

        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        out = await per_message(conninfo, send, n, asyncio.sleep, relays=len(HOSTS))
        out["top_statements"] = _top_statements(conninfo)
        rate, idle_statements = await _idle(conninfo)
        out["idle_commits_per_s_per_relay"] = round(rate / len(HOSTS), 2)
        out["idle_statements"] = idle_statements
    finally:
        await sender.close()
    return out


def _top_statements(conninfo: str) -> list[tuple[int, float, str]]:
    """The statements run during the idle window and the sends, most frequent first: calls,
    mean server time (ms), text."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT calls, round(mean_exec_time::numeric, 3), "
            "left(regexp_replace(query, '\\s+', ' ', 'g'), 160) "
            "FROM pg_stat_statements ORDER BY calls DESC LIMIT 25"
        ).fetchall()
    return [(int(c), float(t), str(q)) for c, t, q in rows]


async def _idle(
    conninfo: str, seconds: float = IDLE_S
) -> tuple[float, list[tuple[int, float, str]]]:
    """Commits per second of the whole database over ``seconds`` with nothing sent, and the
    statements run meanwhile."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        await asyncio.sleep(FLUSH_S)
        conn.execute("SELECT pg_stat_statements_reset()")
        row = conn.execute(COMMITS).fetchone()
        await asyncio.sleep(seconds)
        row2 = conn.execute(COMMITS).fetchone()
    assert row is not None and row2 is not None
    # Our own reset and first read are two of the commits counted.
    return (int(row2[0]) - int(row[0]) - 2) / seconds, _top_statements(conninfo)


def count(n: int) -> dict[str, Any]:
    loaded = {"shared_preload_libraries": "pg_stat_statements"}
    with (
        ThrowawayPostgres(fsync=True, server_settings=loaded) as pg,
        tempfile.TemporaryDirectory(prefix="ci-count-") as tmp,
    ):
        migrate.upgrade(pg.url)
        with Cluster(Path(tmp), pg.url, SimHost) as cluster:
            hosts = [cluster.host(h, relay=False) for h in HOSTS]
            for h in hosts:
                h.configure(**BULK_SENDER)
                h.start_relay()
            alpha, beta = hosts
            beta.listen(SINK)
            alpha.wait_sees(SINK, beta.host_id, timeout=60)
            return asyncio.run(_count(alpha, beta, pg.url, n))


USAGE = "usage: python -m lab.storecount [N]  (N messages, 1 to 100000)"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        n = int(args[0]) if args else 200
    except ValueError:
        n = 0
    if len(args) > 1 or not 1 <= n <= 100_000:
        raise SystemExit(USAGE)
    print(json.dumps(count(n), indent=2))


if __name__ == "__main__":
    main()
