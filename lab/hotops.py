"""The delivery path's store operations timed one message at a time (enqueue, fetch, ack),
as the relay runs them: the store's own coroutines on the caller's loop (docs/perf-log/2026-12.md,
"The relay's hot path").

``python -m lab.hotops URL [ROUNDS]``: URL names a migrated scratch database whose rows it
leaves behind. Prints the medians and 90th percentiles in ms as JSON.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

from crossintercom.storage import Ack, MailboxStore, OutboundItem, open_store

SENDER, RECIPIENT = "hotops-a", "hotops-b"
STEPS = ("enqueue", "fetch", "ack")


def _item(mid: str) -> OutboundItem:
    payload = {"id": mid, "message": "x" * 200}
    return OutboundItem(mid, SENDER, RECIPIENT, "s1", "d" * 64, payload, 260)


async def _one(
    store: MailboxStore, mid: str, gens: tuple[int, int], out: dict[str, list[float]]
) -> None:
    ga, gb = gens
    t0 = time.perf_counter()
    await store.enqueue([_item(mid)], generation=ga)
    t1 = time.perf_counter()
    rows = await store.fetch_inbound(RECIPIENT, gb, session_ids=["s1"])
    t2 = time.perf_counter()
    await store.ack(RECIPIENT, gb, [Ack(r.message_id, "s1", "delivered") for r in rows])
    t3 = time.perf_counter()
    for step, took in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2), strict=True):
        out[step].append(took * 1000)


async def measure(url: str, rounds: int) -> dict[str, float]:
    store = await open_store(url)
    try:
        gens = (await store.claim_host(SENDER), await store.claim_host(RECIPIENT))
        times: dict[str, list[float]] = {s: [] for s in STEPS}
        for i in range(10 + rounds):  # 10 warm-up rounds, not counted
            sink = times if i >= 10 else {s: [] for s in STEPS}
            await _one(store, f"op-{i}-{time.time_ns()}", gens, sink)
    finally:
        await store.aclose()
    result: dict[str, float] = {}
    for step, xs in times.items():
        result[f"{step} p50"] = round(statistics.median(xs), 3)
        result[f"{step} p90"] = round(sorted(xs)[int(len(xs) * 0.9)], 3)
    return result


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        raise SystemExit("usage: python -m lab.hotops URL [ROUNDS]")
    print(json.dumps(asyncio.run(measure(args[0], int(args[1]) if len(args) > 1 else 300))))


if __name__ == "__main__":
    main()
