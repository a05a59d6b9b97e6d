"""What the relay fault tests share: a stream of sends through the Python API (in the
foreground or a thread), waiting until every acknowledged message is in the recipient's inbox,
and the lost / duplicated count each case prints (docs/reliability.md)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from tests.relay.conftest import Host, Listener, wait_for

ACKED = ("delivered", "queued")


async def _send_all(
    ac: Any, target: str, n: int, prefix: str, into: dict[str, str], concurrency: int
) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            r = await ac.send(target, f"{prefix} {i}")
            into[r.id] = r.outcome.value

    await asyncio.gather(*(one(i) for i in range(n)))


def stream(
    client: Any, target: str, n: int, prefix: str, *, concurrency: int = 8
) -> dict[str, str]:
    """Send ``n`` messages through the Python API, ``concurrency`` at a time: {id: outcome}."""
    out: dict[str, str] = {}
    client.run(lambda ac: _send_all(ac, target, n, prefix, out, concurrency))
    return out


def stream_in_background(
    client: Any, target: str, n: int, prefix: str, *, concurrency: int = 8
) -> tuple[threading.Thread, dict[str, str], list[BaseException]]:
    """``stream`` in a thread; the returned dict fills as outcomes arrive."""
    progress: dict[str, str] = {}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            client.run(lambda ac: _send_all(ac, target, n, prefix, progress, concurrency))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, progress, errors


def settle(
    recipient: Host, name: str, acked: set[str], listener: Listener | None, timeout: float = 90
) -> Counter[str]:
    """Wait until every acknowledged id is in NAME's inbox on ``recipient``; return the counts."""

    def all_there() -> bool:
        held = recipient.inbox(name)
        return acked <= set(held)

    wait_for(
        all_there,
        timeout,
        lambda: f"{len(acked - set(recipient.inbox(name)))} acknowledged messages to arrive",
    )
    if listener is not None:
        wait_for(
            lambda: acked <= set(listener.message_ids()),
            30,
            lambda: f"{len(acked - set(listener.message_ids()))} messages to be printed",
        )
    time.sleep(1.0)  # a late duplicate would show up now
    return recipient.inbox(name)


def report(
    case: str, outcomes: Mapping[str, str], acked: set[str], held: Counter[str], **extra: Any
) -> tuple[int, int]:
    lost = len(acked - set(held))
    dups = sum(c - 1 for c in held.values() if c > 1)
    summary = {
        "case": case,
        "attempted": len(outcomes),
        "outcomes": dict(Counter(outcomes.values())),
        "acknowledged": len(acked),
        "lost": lost,
        "duplicates": dups,
        **extra,
    }
    print("FAULT-COUNTS " + json.dumps(summary, sort_keys=True))
    return lost, dups
