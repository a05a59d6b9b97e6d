"""A runtime dir on a small filesystem that filled up for a while: the broker's sweep keeps
emptying the host's own WALs whatever else fails, so once the filler is gone the space they
held is there to save mail, and the 36 messages queued meanwhile arrive; a filesystem under
the documented minimum is named at start, in both logs and in `status`
(docs/operations.md, "Runtime dir size")."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from crossintercom.client.aio import AsyncClient
from crossintercom.tools.chaos import disk
from tests.relay.conftest import Cluster, wait_for


@pytest.fixture
def tiny(cluster: Cluster) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    yield cluster
    for h in cluster.hosts:
        if os.path.ismount(h.home):
            subprocess.run(["umount", "-l", str(h.home)], check=False)


def test_delivery_resumes_after_a_small_runtime_dir_was_full(tiny: Cluster) -> None:
    a = tiny.host("A", remote_ack_wait_s=1)
    b = tiny.host("B", relay=False)
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(b.home)]
    subprocess.run(mount, check=True)
    b.configure(sweep_interval_s=1)
    b.start_relay()
    b.listen("worker")
    a.listen("sink")
    a.wait_sees("worker", "B")
    b.wait_sees("sink", "A")
    too_small = "under the 8 MiB it needs"
    assert too_small in b.relay_log()
    assert too_small in (b.home / "broker.log").read_text()
    assert any(too_small in w for w in b.cli_json("status")["warnings"])

    # Traffic both ways first: B's own files (its WALs) grow as they do in use.
    back = b.client("back")

    async def preload(client: AsyncClient) -> None:
        for n in range(10):
            await asyncio.gather(*(client.send("sink@A", f"{n}.{i}") for i in range(40)))

    back.run(preload)
    planner = a.client("planner")
    filler = disk.fill(b.home)

    async def send_all(client: AsyncClient) -> list[str]:
        sends = [client.send("worker@B", f"m{i} " + "x" * 2000) for i in range(36)]
        return [r.id for r in await asyncio.gather(*sends)]

    ids = planner.run(send_all)
    time.sleep(10)  # the fault itself: the disk stays full this long
    filler.unlink()
    wait_for(lambda: set(ids) <= set(b.inbox("worker")), 90, "every message after the fill")
