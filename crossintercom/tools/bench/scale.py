"""`bench --scale`: one broker with many sessions beside an identical broker with two.

Two simulated hosts (each its broker spawned by its first client; no relay), each with a live
listener and a sender; ``sessions`` more (durable named sessions, one connection each, from the
bench process) connect to the second. Then rounds alternate the two brokers, like the raw
baselines and the paths of the other figures: same-host `delivered` latency and `list` latency
on each, back to back; a figure's ratio is the median of the rounds' ratios. Measuring the
two-session figure once before the crowd connects left the ratio to one pair of runs, which
swung 0.9x to 1.6x from one run to the next (docs/perf-log/2026-12.md, "The scale
figures, alternated"). Also the crowded broker's resident memory per session (``/proc/PID/status``
``VmRSS``, before and after the crowd). The ratio target of issue 9 is the send latency with
many sessions within 1.2x of the two-session figure.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from crossintercom.client import AsyncClient
from crossintercom.errors import CrossintercomError
from crossintercom.tools.bench import paths
from crossintercom.tools.bench.report import Figure, percentile
from crossintercom.tools.harness import BULK_SENDER, SimHost

SEND_TARGET = 1.2
ROUNDS = 5
_CONNECT_BATCH = 50


def _rss_kib(pid: int | None) -> int:
    if pid is None:
        raise CrossintercomError("the broker did not start")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise CrossintercomError("no VmRSS for the broker")


async def _list_ms(client: AsyncClient, n: int) -> float:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        await client.list_sessions()
        lat.append(time.perf_counter() - t0)
    return percentile(lat, 50) * 1000


async def _phase(client: AsyncClient, host: SimHost, sends: int, lists: int) -> dict[str, float]:
    seq = await paths.sequential(client, host, "sink0", sends)
    return {
        "send_delivered_p50_ms": percentile(seq.delivered, 50) * 1000,
        "list_p50_ms": await _list_ms(client, lists),
    }


async def _measure(
    few_host: SimHost, many_host: SimHost, sessions: int, sends: int
) -> dict[str, Any]:
    senders = {
        name: AsyncClient(host.settings, host.identity("scale-sender", cwd="/"))
        for name, host in (("two", few_host), ("many", many_host))
    }
    hosts = {"two": few_host, "many": many_host}
    crowd: list[AsyncClient] = []
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        for name, sender in senders.items():
            await sender.connect()
            await asyncio.to_thread(hosts[name].wait_sees, "sink0", hosts[name].host_id)
            await paths.sequential(sender, hosts[name], "sink0", 10)  # warm-up
        rss_before = _rss_kib(many_host.broker_pid())
        for start in range(0, sessions, _CONNECT_BATCH):
            batch = [
                AsyncClient(many_host.settings, many_host.identity(f"scale-{k}", cwd="/"))
                for k in range(start, min(sessions, start + _CONNECT_BATCH))
            ]
            crowd += batch
            await asyncio.gather(*(c.connect() for c in batch))
        rss_after = _rss_kib(many_host.broker_pid())
        for r in range(ROUNDS):
            order = ("two", "many") if r % 2 == 0 else ("many", "two")
            got = {n: await _phase(senders[n], hosts[n], sends, 20) for n in order}
            rounds.append(got)
    finally:
        await asyncio.gather(
            *(c.close() for c in [*senders.values(), *crowd]), return_exceptions=True
        )
    return {
        "sessions": sessions,
        "rounds": rounds,
        "two": _medians(rounds, "two"),
        "many": {**_medians(rounds, "many"), "broker_rss_kib": rss_after},
        "rss_kib_per_session": (rss_after - rss_before) / max(1, sessions),
    }


def _medians(rounds: list[dict[str, dict[str, float]]], which: str) -> dict[str, float]:
    keys = rounds[0][which]
    return {k: statistics.median(r[which][k] for r in rounds) for k in keys}


def _ratios(rounds: list[dict[str, dict[str, float]]], key: str) -> list[float]:
    return [r["many"][key] / r["two"][key] for r in rounds if r["two"][key] > 0]


def scale_figures(
    root: Path, store_url: str, *, sessions: int, sends: int
) -> tuple[list[Figure], dict[str, Any]]:
    """The scale figures and their details (memory per session, both phases' values)."""
    few_host = SimHost(root, "bench-scale-two", store_url)
    many_host = SimHost(root, "bench-scale-many", store_url)
    try:
        for host in (few_host, many_host):
            host.configure(**BULK_SENDER)
            host.listen("sink0")
        out = asyncio.run(_measure(few_host, many_host, sessions, sends))
    finally:
        for host in (few_host, many_host):
            host.stop()
    few, many, rounds = out["two"], out["many"], out["rounds"]
    what = (
        f"an identical broker with 2 sessions, alternated in {ROUNDS} rounds "
        f"({sends} sequential sends each)"
    )
    figures = [
        Figure(
            f"scale {sessions} sessions",
            "delivered p50",
            "ms",
            many["send_delivered_p50_ms"],
            few["send_delivered_p50_ms"],
            what,
            False,
            SEND_TARGET,
            pairing="round trip",
            ratios=_ratios(rounds, "send_delivered_p50_ms"),
        ),
        Figure(
            f"scale {sessions} sessions",
            "list p50",
            "ms",
            many["list_p50_ms"],
            few["list_p50_ms"],
            "an identical broker with 2 sessions, alternated",
            False,
            pairing="round trip",
            ratios=_ratios(rounds, "list_p50_ms"),
        ),
    ]
    out["rss_kib_per_session"] = round(out["rss_kib_per_session"], 1)
    return figures, out
