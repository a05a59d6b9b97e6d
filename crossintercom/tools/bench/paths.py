"""The crossintercom paths the benchmark times: same-host and cross-host sends, one at a time
(latency) and many in flight from several senders (throughput)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from crossintercom.client import AsyncClient
from crossintercom.errors import CrossintercomError
from crossintercom.inbox import Inbox
from crossintercom.tools.bench.workload import Counts, text
from crossintercom.tools.harness import SimHost


def inbox_counter(host: SimHost, name: str) -> Callable[[], int]:
    """Counts the messages saved in NAME's inbox on ``host`` (0 before it has one)."""
    directory, session_id = host.settings.inbox_dir, host.session_id(name)

    def count() -> int:
        with Inbox.view(directory, session_id) as inbox:
            return inbox.count()

    return count


async def _latency(client: AsyncClient, target: str, n: int) -> tuple[list[float], Counter[str]]:
    lat: list[float] = []
    outcomes: Counter[str] = Counter()
    for i in range(n):
        t0 = time.perf_counter()
        r = await client.send(target, text(i))
        lat.append(time.perf_counter() - t0)
        outcomes[r.outcome.value] += 1
    return lat, outcomes


async def _throughput(
    senders: list[AsyncClient],
    targets: list[str],
    inboxes: list[Callable[[], int]],
    total: int,
    window: int,
) -> tuple[float, Counter[str], float]:
    """Messages/s from several senders until every recipient's inbox holds them all."""
    before = [await asyncio.to_thread(f) for f in inboxes]
    outcomes: Counter[str] = Counter()
    per_sender = total // len(senders)

    async def blast(client: AsyncClient, target: str) -> None:
        gate = asyncio.Semaphore(window)

        async def one(i: int) -> None:
            async with gate:
                r = await client.send(target, text(i))
                outcomes[r.outcome.value] += 1

        await asyncio.gather(*(one(i) for i in range(per_sender)))

    pairs = [(c, targets[k % len(targets)]) for k, c in enumerate(senders)]
    expected = Counter(t for _, t in pairs)
    t0 = time.perf_counter()
    await asyncio.gather(*(blast(c, t) for c, t in pairs))
    sent_s = time.perf_counter() - t0
    deadline = time.monotonic() + 60
    while True:
        now = [await asyncio.to_thread(f) for f in inboxes]
        if all(
            n - b >= expected[t] * per_sender for n, b, t in zip(now, before, targets, strict=True)
        ):
            break
        if time.monotonic() > deadline:
            raise CrossintercomError("not every message reached its recipient within 60 s")
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    return per_sender * len(senders) / elapsed, outcomes, sent_s


async def crossintercom_paths(
    alpha: SimHost, beta: SimHost, counts: Counts, sinks: list[str]
) -> dict[str, Any]:
    """Senders on alpha; the ``sinks`` listen on both hosts (and alpha lists them all online)."""
    senders = [
        AsyncClient(alpha.settings, alpha.identity(f"bench-s{k}", cwd="/"))
        for k in range(counts.senders)
    ]
    try:
        for c in senders:
            await c.connect()
        local = [f"{n}@{alpha.host_id}" for n in sinks]
        remote = [f"{n}@{beta.host_id}" for n in sinks]
        await _latency(senders[0], local[0], 10)  # warm-up
        await _latency(senders[0], remote[0], 10)
        same_lat, same_out = await _latency(senders[0], local[0], counts.same_latency)
        cross_lat, cross_out = await _latency(senders[0], remote[0], counts.cross_latency)

        same_rate, same_tp_out, _ = await _throughput(
            senders,
            local,
            [inbox_counter(alpha, n) for n in sinks],
            counts.same_throughput,
            counts.window,
        )
        cross_rate, cross_tp_out, cross_sent_s = await _throughput(
            senders,
            remote,
            [inbox_counter(beta, n) for n in sinks],
            counts.cross_throughput,
            counts.window,
        )
    finally:
        for c in senders:
            await c.close()
    return {
        "same_latency": same_lat,
        "cross_latency": cross_lat,
        "same_rate": same_rate,
        "cross_rate": cross_rate,
        "outcomes": {
            "same_latency": dict(same_out),
            "cross_latency": dict(cross_out),
            "same_throughput": dict(same_tp_out),
            "cross_throughput": dict(cross_tp_out),
        },
        "cross_throughput_all_answered_s": round(cross_sent_s, 3),
    }
