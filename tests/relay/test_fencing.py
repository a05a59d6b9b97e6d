"""Fencing a frozen relay: it read rows, froze (SIGSTOP, as a paused VM would) past its lease,
a relay for the same host id took over on another machine and delivered them, then it was
resumed. The stale relay must hand nothing over, ack nothing and write nothing, including the
rows it had in flight; every message arrives exactly once, on the new machine.
"""

from __future__ import annotations

from collections import Counter

from tests.relay.conftest import Cluster, wait_for
from tests.relay.faultkit import ACKED, report, stream
from tests.relay.frozen import freeze_after_read, thaw


def test_frozen_relay_is_fenced_after_takeover(cluster: Cluster) -> None:
    frozen = freeze_after_read(cluster)
    a, planner, in_flight = frozen.sender, frozen.planner, frozen.in_flight

    new = cluster.host("B", dirname="B2", lease_s=3)
    worker_new = new.listen("worker")
    wait_for(lambda: in_flight.id in new.inbox("worker"), 30, "the new relay to deliver it")
    part2 = stream(planner, "worker@B", 20, "p2")
    acked = {i for i, o in part2.items() if o in ACKED} | {in_flight.id}
    wait_for(lambda: acked <= set(new.inbox("worker")), 60, "everything on the new machine")

    # the stale relay handed nothing over and changed nothing: worker@B is still the new one
    log = thaw(frozen, timeout=30)
    assert "not handed over" in log, log[-2000:]
    a.wait_sees("worker", "B", online=True)
    last = planner.send("worker@B", "after the stale relay is gone")
    assert last.outcome.value == "delivered", last
    acked.add(last.id)
    wait_for(lambda: last.id in worker_new.message_ids(), 30, "the last message printed")

    both: Counter[str] = Counter()
    both.update(frozen.old.inbox("worker"))
    both.update(new.inbox("worker"))
    everything = {**part2, in_flight.id: "queued", last.id: "delivered"}
    lost, dups = report("frozen_relay", everything, acked, both)
    assert lost == 0
    assert dups == 0
    assert all(c == 1 for c in worker_new.message_ids().values())
