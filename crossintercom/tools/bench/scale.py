"""`bench --scale`: one broker with many sessions beside the same broker with two.

One simulated host (its broker spawned by the first client; no relay), a live listener and a
sender. With only those two sessions, then with ``sessions`` more connected (durable named
sessions, one connection each, from the bench process): `list` latency, same-host `delivered`
latency and the broker's resident memory (``/proc/PID/status`` ``VmRSS``). The ratio target of
issue 9 is the send latency with many sessions within 1.2x of the two-session figure.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from crossintercom.client import AsyncClient
from crossintercom.errors import CrossintercomError
from crossintercom.tools.bench import paths
from crossintercom.tools.bench.report import Figure, percentile
from crossintercom.tools.harness import BULK_SENDER, SimHost

SEND_TARGET = 1.2
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
        "broker_rss_kib": _rss_kib(host.broker_pid()),
    }


async def _measure(host: SimHost, sessions: int, sends: int) -> dict[str, Any]:
    sender = AsyncClient(host.settings, host.identity("scale-sender", cwd="/"))
    crowd: list[AsyncClient] = []
    try:
        await sender.connect()
        await asyncio.to_thread(host.wait_sees, "sink0", host.host_id)
        await paths.sequential(sender, host, "sink0", 10)  # warm-up
        few = await _phase(sender, host, sends, 20)
        for start in range(0, sessions, _CONNECT_BATCH):
            batch = [
                AsyncClient(host.settings, host.identity(f"scale-{k}", cwd="/"))
                for k in range(start, min(sessions, start + _CONNECT_BATCH))
            ]
            crowd += batch
            await asyncio.gather(*(c.connect() for c in batch))
        many = await _phase(sender, host, sends, 20)
    finally:
        await asyncio.gather(*(c.close() for c in [sender, *crowd]), return_exceptions=True)
    per_session = (many["broker_rss_kib"] - few["broker_rss_kib"]) / max(1, sessions)
    return {"sessions": sessions, "two": few, "many": many, "rss_kib_per_session": per_session}


def scale_figures(
    root: Path, store_url: str, *, sessions: int, sends: int
) -> tuple[list[Figure], dict[str, Any]]:
    """The scale figures and their details (memory per session, both phases' values)."""
    host = SimHost(root, "bench-scale", store_url)
    host.configure(**BULK_SENDER)
    try:
        host.listen("sink0")
        out = asyncio.run(_measure(host, sessions, sends))
    finally:
        host.stop()
    few, many = out["two"], out["many"]
    what = f"the same broker with 2 sessions, same run ({sends} sequential sends)"
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
        ),
        Figure(
            f"scale {sessions} sessions",
            "list p50",
            "ms",
            many["list_p50_ms"],
            few["list_p50_ms"],
            "the same broker with 2 sessions, same run",
            False,
            pairing="round trip",
        ),
    ]
    out["rss_kib_per_session"] = round(out["rss_kib_per_session"], 1)
    return figures, out
