"""A host role's acks as its sender's unread receipts pile up (docs/performance.md, "Row
security's cost per message").

``python -m lab.hostacks URL [ROUNDS]``: URL names a migrated scratch PostgreSQL database, as a
role that may create roles; two host roles are made in it (``hostacks-a``, ``hostacks-b``; their
rows and roles are left behind). Each round, A enqueues 32 messages to B and B fetches and acks
them; A never reads its receipts. Prints the median ack per batch in ms, per quarter of the
rounds, as JSON.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

from sqlalchemy.engine import make_url

from crossintercom.storage import Ack, OutboundItem, open_store
from crossintercom.storage.roles import grant_host

SENDER, RECIPIENT = "hostacks-a", "hostacks-b"
BATCH = 32
PASSWORD = "hostacks"


def _as(url: str, role: str) -> str:
    return make_url(url).set(username=role, password=PASSWORD).render_as_string(False)


async def measure(url: str, rounds: int) -> dict[str, float]:
    sender = await open_store(_as(url, grant_host(url, SENDER, PASSWORD)[0]))
    recipient = await open_store(_as(url, grant_host(url, RECIPIENT, PASSWORD)[0]))
    acks: list[float] = []
    try:
        ga, gb = await sender.claim_host(SENDER), await recipient.claim_host(RECIPIENT)
        for i in range(rounds):
            items = []
            for j in range(BATCH):
                mid = f"hostacks-{i}-{j}-{time.time_ns()}"
                payload = {"id": mid, "message": "x" * 200}
                items.append(OutboundItem(mid, SENDER, RECIPIENT, "s1", "d" * 64, payload, 260))
            await sender.enqueue(items, generation=ga)
            rows = await recipient.fetch_inbound(RECIPIENT, gb, session_ids=["s1"])
            t0 = time.perf_counter()
            await recipient.ack(RECIPIENT, gb, [Ack(r.message_id, "s1", "delivered") for r in rows])
            acks.append((time.perf_counter() - t0) * 1000)
    finally:
        await sender.aclose()
        await recipient.aclose()
    step = max(1, rounds // 4)
    return {
        f"rounds {k}-{k + step}": round(statistics.median(acks[k : k + step]), 2)
        for k in range(0, rounds, step)
    }


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        raise SystemExit("usage: python -m lab.hostacks URL [ROUNDS]")
    print(json.dumps(asyncio.run(measure(args[0], int(args[1]) if len(args) > 1 else 400))))


if __name__ == "__main__":
    main()
