"""Fencing a frozen relay: it read rows, froze (SIGSTOP, as a paused VM would) past its lease,
a relay for the same host id took over on another machine and delivered them, then it was
resumed. The stale relay must hand nothing over, ack nothing and write nothing, including the
rows it had in flight; every message arrives exactly once, on the new machine.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

from crossintercom.testhooks import FAULTS_ENV
from tests.relay.conftest import Cluster, wait_for
from tests.relay.test_relay_faults import ACKED, report, stream


def _stopped(pid: int) -> bool:
    """The process is in the stopped state (SIGSTOP)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def test_frozen_relay_is_fenced_after_takeover(cluster: Cluster) -> None:
    a = cluster.host("A", remote_ack_wait_s=1)
    old = cluster.host("B", relay=False, dirname="B1", lease_s=3)
    # the old relay freezes itself right after reading its first rows, before handing them over
    old.env[FAULTS_ENV] = "stop:relay_after_fetch"
    old.start_relay()
    stale = old.relay
    assert stale is not None
    worker_old = old.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")

    in_flight = planner.send("worker@B", "read, then frozen")
    assert in_flight.outcome.value == "queued", in_flight
    wait_for(lambda: _stopped(stale.pid), 30, "the old relay to freeze after its read")

    new = cluster.host("B", dirname="B2", lease_s=3)
    worker_new = new.listen("worker")
    wait_for(lambda: in_flight.id in new.inbox("worker"), 30, "the new relay to deliver it")
    part2 = stream(planner, "worker@B", 20, "p2")
    acked = {i for i, o in part2.items() if o in ACKED} | {in_flight.id}
    wait_for(lambda: acked <= set(new.inbox("worker")), 60, "everything on the new machine")

    stale.send_signal(signal.SIGCONT)
    code = stale.wait(30)
    assert code != 0
    log = old.relay_log()
    assert "took over" in log, log[-2000:]
    assert "not handed over" in log, log[-2000:]

    # the stale relay handed nothing over and changed nothing: worker@B is still the new one
    assert old.inbox("worker") == Counter()
    assert worker_old.message_ids() == Counter()
    a.wait_sees("worker", "B", online=True)
    last = planner.send("worker@B", "after the stale relay is gone")
    assert last.outcome.value == "delivered", last
    acked.add(last.id)
    wait_for(lambda: last.id in worker_new.message_ids(), 30, "the last message printed")

    both: Counter[str] = Counter()
    both.update(old.inbox("worker"))
    both.update(new.inbox("worker"))
    everything = {**part2, in_flight.id: "queued", last.id: "delivered"}
    lost, dups = report("frozen_relay", everything, acked, both)
    assert lost == 0
    assert dups == 0
    assert all(c == 1 for c in worker_new.message_ids().values())
