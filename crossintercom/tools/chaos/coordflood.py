"""The ``coord_flood`` fault of `crossintercom chaos`: a session of one host floods its broker
with coordination requests (reserves of a hundred globs each, unreserves, inbound policy
changes) beside the mail. It must meet its quota and its rate (``reservation_quota``,
``coord_rate_limited``) and slow no one else's mail: the run's lost and duplicated counts stay
0 (docs/agents.md#path-reservations)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import Any

from crossintercom.client import AsyncClient, inbound_policy, reserve, unreserve
from crossintercom.errors import CrossintercomError
from crossintercom.tools.harness import SimHost

PROJECT = "chaos.example/flood"
# One burst: this many requests at most, for at most this long, this many in flight.
REQUESTS = 400
BURST_S = 1.5
IN_FLIGHT = 8


async def flood(host: SimHost) -> dict[str, Any]:
    """One burst from a session "flooder" of ``host``; what it was answered, by code."""
    client = AsyncClient(host.settings, host.identity("flooder", cwd="/"))
    answered: Counter[str] = Counter()
    made = itertools.count()
    end = time.monotonic() + BURST_S

    async def one(n: int) -> None:
        try:
            if n % 4 == 3:
                await inbound_policy(client, f"nobody-{n % 7}", "hold" if n % 2 else None)
            elif n % 4 == 2:
                await unreserve(client, PROJECT, [f"f{n - 1}/*"])
            else:
                await reserve(client, PROJECT, [f"f{n}/{i}/*" for i in range(100)], ttl_s=60)
            answered["ok"] += 1
        except CrossintercomError as exc:
            answered[str(exc.code)] += 1

    async def worker() -> None:
        while time.monotonic() < end and (n := next(made)) < REQUESTS:
            await one(n)

    try:
        await client.connect()
        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    except CrossintercomError as exc:  # no broker now (another fault): nothing to flood
        answered[str(exc.code)] += 1
    finally:
        await client.close()
    return {"answered": dict(answered)}
