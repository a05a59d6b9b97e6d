"""The crossintercom paths the benchmark times, through the public client API.

* ``sequential``: one send at a time; each gives its ``delivered`` time (the send's round trip)
  and its one-way time (send start to the recipient's inbox ``received_at``, one wall clock);
* ``ask_reply``: one ask at a time, answered by a replier session, until the reply is back;
* ``throughput``: several senders, many sends in flight, until every inbox holds them all;
* ``catch_up``: a backlog queued while the recipient host's relay is down, then the time from
  restarting that relay until every message is saved.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from crossintercom.client import AsyncClient
from crossintercom.errors import CrossintercomError
from crossintercom.inbox import Inbox
from crossintercom.tools.bench.workload import text
from crossintercom.tools.harness import SimHost

_SETTLE_S = 60.0
# A backlog is given at least this rate to drain before the bench gives up (a loaded machine).
_SLOWEST_CATCH_UP = 50.0


def inbox_counter(host: SimHost, name: str) -> Callable[[], int]:
    """Counts the messages saved in NAME's inbox on ``host`` (0 before it has one), as a running
    total: each call reads only the entries saved since the call before. Counting the whole
    inbox on every poll took 4.5 ms of CPU per inbox at 25,000 entries, half a core of the
    bench's own process taken from the path it times during a catch-up (docs/perf-log/2026-12.md,
    "Catch-up: where the time goes")."""
    directory, session_id = host.settings.inbox_dir, host.session_id(name)
    total, last = 0, 0

    def count() -> int:
        nonlocal total, last
        with Inbox.view(directory, session_id) as inbox:
            new, last = inbox.count_after(last)
        total += new
        return total

    return count


@dataclass
class Sequential:
    delivered: list[float] = field(default_factory=list)
    one_way: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)


async def _until(predicate: Callable[[], bool], what: str, within: float = _SETTLE_S) -> None:
    deadline = time.monotonic() + within
    while not await asyncio.to_thread(predicate):
        if time.monotonic() > deadline:
            raise CrossintercomError(f"{what} within {within:.0f} s")
        await asyncio.sleep(0.01)


async def sequential(client: AsyncClient, host: SimHost, name: str, n: int) -> Sequential:
    """``n`` sends to NAME on ``host``, one at a time."""
    out = Sequential()
    started: dict[str, float] = {}
    for i in range(n):
        wall, t0 = time.time(), time.perf_counter()
        r = await client.send(f"{name}@{host.host_id}", text(i))
        out.delivered.append(time.perf_counter() - t0)
        out.outcomes[r.outcome.value] += 1
        started[r.id] = wall

    def saved() -> dict[str, float]:
        with host.open_inbox(name) as inbox:
            return inbox.received_at(list(started))

    # A `queued` send is saved later: wait for every one, so one-way covers them all.
    await _until(lambda: len(saved()) == len(started), "not every message was saved")
    out.one_way = [at - started[mid] for mid, at in saved().items()]
    return out


async def ask_reply(asker: AsyncClient, replier: AsyncClient, target: str, n: int) -> Sequential:
    """``n`` asks to ``target`` (the replier's session), each until its reply is back."""

    async def answer() -> None:
        while True:
            incoming = await replier.next_incoming()
            if incoming is not None and incoming.message is not None:
                await replier.reply("re", reply_to=incoming.message.id)

    out = Sequential()
    task = asyncio.create_task(answer())
    try:
        for i in range(n):
            t0 = time.perf_counter()
            r = await asker.ask(target, text(i), timeout=_SETTLE_S)
            out.delivered.append(time.perf_counter() - t0)
            out.outcomes["replied" if r.reply is not None else r.outcome.value] += 1
    finally:
        task.cancel()
    return out


async def throughput(
    senders: list[AsyncClient],
    host: SimHost,
    sinks: list[str],
    total: int,
    window: int,
) -> tuple[float, Counter[str]]:
    """Messages/s from several senders until every recipient's inbox holds them all."""
    inboxes = [inbox_counter(host, n) for n in sinks]
    targets = [f"{n}@{host.host_id}" for n in sinks]
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

    pairs = [(c, k % len(targets)) for k, c in enumerate(senders)]
    expected = Counter(k for _, k in pairs)
    t0 = time.perf_counter()
    await asyncio.gather(*(blast(c, targets[k]) for c, k in pairs))

    def all_saved() -> bool:
        return all(
            f() - b >= expected[k] * per_sender
            for k, (f, b) in enumerate(zip(inboxes, before, strict=True))
        )

    await _until(all_saved, "not every message reached its recipient")
    return per_sender * len(senders) / (time.perf_counter() - t0), outcomes


async def catch_up(
    filler: AsyncClient, host: SimHost, sinks: list[str], total: int, window: int
) -> tuple[float, Counter[str]]:
    """Messages/s saved after ``host``'s relay restarts with ``total`` rows queued for it."""
    inboxes = [inbox_counter(host, n) for n in sinks]
    before = sum([await asyncio.to_thread(f) for f in inboxes])
    await asyncio.to_thread(host.stop_relay)
    gate = asyncio.Semaphore(window)
    outcomes: Counter[str] = Counter()

    async def one(i: int) -> None:
        async with gate:
            r = await filler.send(f"{sinks[i % len(sinks)]}@{host.host_id}", text(i))
            outcomes[r.outcome.value] += 1

    await asyncio.gather(*(one(i) for i in range(total)))
    t0 = time.perf_counter()
    await asyncio.to_thread(host.start_relay)
    await _until(
        lambda: sum(f() for f in inboxes) - before >= total,
        "the backlog was not caught up",
        max(_SETTLE_S, total / _SLOWEST_CATCH_UP),
    )
    return total / (time.perf_counter() - t0), outcomes
