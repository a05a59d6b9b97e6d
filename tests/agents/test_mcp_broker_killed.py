"""`crossintercom mcp` keeps working when the broker under it is SIGKILLed: a later tool call
works again within seconds without restarting the server, and mail sent to it while the broker
was down, or right after, is delivered exactly once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from tests.agents.conftest import Cluster, Host, Mcp, mcp_server, parse_mail, until
from tests.conftest import broker_pid, kill_broker

ACKED = {"delivered", "queued"}
RECOVERY_S = 15.0


def test_mcp_server_recovers_after_broker_sigkill(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    asyncio.run(_recover(a, b))


async def _collect(worker: Mcp, into: Counter[str]) -> bool:
    """One inbox call; its message ids are counted. False if the call failed."""
    result = await worker.call("inbox")
    if result.is_error:
        return False
    into.update(m["id"] for m in parse_mail(str(result.content[0].text)))
    return True


async def _recover(a: Host, b: Host) -> None:
    boss = b.client("boss")
    async with mcp_server(a.env, "worker") as (worker, _):
        await until(lambda: b.sees("worker", "A"), 30, "B to see worker@A")
        seen: Counter[str] = Counter()
        before = boss.send("worker@A", "before the kill")
        assert before.outcome.value == "delivered"
        old = kill_broker(a.home)
        assert old is not None
        killed_at = time.monotonic()

        # Sent straight after the kill: A's broker is down or still respawning.
        during = await asyncio.to_thread(boss.send, "worker@A", "while the broker is down")
        assert during.outcome.value in ACKED, during

        # The next tool calls work again within seconds, on a new broker, same server process.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RECOVERY_S
        while True:
            if await _collect(worker, seen):
                sent = await worker.call("send", to="boss@B", message="back")
                if not sent.is_error and sent.structured_content["outcome"] in ACKED:
                    break
            if loop.time() > deadline:
                raise AssertionError(f"mcp tool calls did not recover in {RECOVERY_S}s")
            await asyncio.sleep(0.1)
        recovered = time.monotonic() - killed_at
        new = broker_pid(a.home)
        assert new is not None and new != old

        after = await asyncio.to_thread(boss.send, "worker@A", "right after")
        assert after.outcome.value in ACKED, after
        wanted = {before.id, during.id, after.id}

        async def all_there() -> bool:
            await _collect(worker, seen)
            return wanted <= set(seen)

        deadline = loop.time() + 30
        while not await all_there():
            assert loop.time() < deadline, f"missing {wanted - set(seen)}"
            await asyncio.sleep(0.1)
        # A late duplicate would show up in the next calls.
        for _ in range(10):
            await _collect(worker, seen)
            await asyncio.sleep(0.1)
        assert all(seen[m] == 1 for m in wanted), seen
        assert all(c == 1 for c in a.inbox("worker").values())
        print(f"mcp recovery: tool calls worked again {recovered:.2f}s after the broker SIGKILL")
