"""The delivery path's store operations timed one message at a time, the relay's old way (a
thread hop into the blocking SQLAlchemy store) against its hot path (``store.hot_path()``),
alternated round by round in one process (docs/performance.md, "The relay's hot path").

``python -m crossintercom.tools.hotops URL [ROUNDS]``: URL names a migrated scratch database
whose rows it leaves behind. Prints the medians and 90th percentiles in ms as JSON.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

from crossintercom.storage import Ack, HotPath, MailboxStore, OutboundItem, open_store
from crossintercom.storage.hotpath import ThreadHotPath

SENDER, RECIPIENT = "hotops-a", "hotops-b"
STEPS = ("enqueue", "fetch", "ack")


def _item(mid: str) -> OutboundItem:
    payload = {"id": mid, "message": "x" * 200}
    return OutboundItem(mid, SENDER, RECIPIENT, "s1", "d" * 64, payload, 260)


async def _one(path: HotPath, mid: str, gens: tuple[int, int], out: dict[str, list[float]]) -> None:
    ga, gb = gens
    t0 = time.perf_counter()
    await path.enqueue([_item(mid)], generation=ga)
    t1 = time.perf_counter()
    rows = await path.fetch_inbound(RECIPIENT, gb, session_ids=["s1"])
    t2 = time.perf_counter()
    await path.ack(RECIPIENT, gb, [Ack(r.message_id, "s1", "delivered") for r in rows])
    t3 = time.perf_counter()
    for step, took in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2), strict=True):
        out[step].append(took * 1000)


async def compare(store: MailboxStore, rounds: int) -> dict[str, float]:
    gens = (store.claim_host(SENDER), store.claim_host(RECIPIENT))
    paths: dict[str, HotPath] = {"thread": ThreadHotPath(store), "hot": store.hot_path()}
    times: dict[str, dict[str, list[float]]] = {k: {s: [] for s in STEPS} for k in paths}
    try:
        for i in range(10 + rounds):  # 10 warm-up rounds, not counted
            kinds = list(paths) if i % 2 == 0 else list(reversed(paths))
            for kind in kinds:
                sink: dict[str, list[float]] = times[kind] if i >= 10 else {s: [] for s in STEPS}
                await _one(paths[kind], f"{kind}-{i}-{time.time_ns()}", gens, sink)
    finally:
        await paths["hot"].aclose()
    result: dict[str, float] = {}
    for kind, steps in times.items():
        for step, xs in steps.items():
            result[f"{kind} {step} p50"] = round(statistics.median(xs), 3)
            result[f"{kind} {step} p90"] = round(sorted(xs)[int(len(xs) * 0.9)], 3)
    return result


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        raise SystemExit("usage: python -m crossintercom.tools.hotops URL [ROUNDS]")
    store = open_store(args[0], hot_path=True)
    try:
        print(json.dumps(asyncio.run(compare(store, int(args[1]) if len(args) > 1 else 300))))
    finally:
        store.close()


if __name__ == "__main__":
    main()
