"""`bench --polling`: cross-host one-way latency over SQLite when the relays poll their doorbells.

On filesystems that carry no change notifications across machines (NFS, SMB, FUSE) the relays
watch the doorbells with watchdog's polling observer (storage/wakeup.py), chosen by themselves;
this phase forces it (``CROSSINTERCOM_POLLING_OBSERVER=1``) on two more hosts over the run's
SQLite store and times sequential sends from one to a `listen` sink on the other, until each is
saved in the sink's inbox. Its baseline is the same path with inotify, the run's cross-host
SQLite one-way p50, so the ratio is what polling costs (docs/performance.md, "Polling").
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from crossintercom.client import AsyncClient
from crossintercom.tools.bench import paths
from crossintercom.tools.bench.report import Figure, percentile
from crossintercom.tools.harness import BULK_SENDER, Cluster, SimHost

ENV_POLLING_OBSERVER = "CROSSINTERCOM_POLLING_OBSERVER"  # relay/run.py reads it
SINK = "sink"


def polling_sends(
    root: Path, store_url: str, sends: int, warm_up: int, token: str
) -> paths.Sequential:
    """``sends`` sequential sends between two polling relays, timed (one-way and delivered)."""
    env = {**os.environ, ENV_POLLING_OBSERVER: "1"}
    with Cluster(root, store_url, SimHost, base_env=env) as cluster:
        ids = [f"bench-poll-{h}-{token}" for h in ("a", "b")]
        a, b = cluster.up(*ids, **dict.fromkeys(ids, BULK_SENDER))
        b.listen(SINK)
        a.wait_sees(SINK, b.host_id, timeout=60)

        async def measure() -> paths.Sequential:
            client = AsyncClient(a.settings, a.identity("bench-poll", cwd="/"))
            await client.connect()
            try:
                await paths.sequential(client, b, SINK, warm_up)
                return await paths.sequential(client, b, SINK, sends)
            finally:
                await client.close()

        return asyncio.run(measure())


def polling_figure(samples: list[float], inotify_p50_ms: float) -> Figure:
    return Figure(
        "cross-host sqlite polling",
        "one-way p50",
        "ms",
        percentile(samples, 50) * 1000.0,
        inotify_p50_ms,
        "the same path with inotify doorbells (cross-host sqlite one-way p50 of this run)",
        False,
        pairing="one-way",
    )
