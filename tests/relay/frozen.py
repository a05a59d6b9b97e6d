"""A relay frozen with rows in flight, for the fencing tests (one store, and across a failover).

``freeze_after_read`` sets it up: host B's relay on a first machine stops itself (SIGSTOP, as
a paused VM would) right after reading its first rows, before handing them over; ``thaw``
resumes it once another machine took B over, and checks that it ends having handed nothing
over on its own machine.
"""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from crossintercom.client import Client
from crossintercom.models import SendResult
from crossintercom.testhooks import FAULTS_ENV
from tests.relay.conftest import Cluster, Host, Listener, wait_for


def stopped(pid: int) -> bool:
    """The process is in the stopped state (SIGSTOP)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@dataclass
class FrozenRelay:
    sender: Host  # A, whose planner sent
    old: Host  # B's first machine
    relay: subprocess.Popen[bytes]  # its relay, stopped
    old_worker: Listener
    planner: Client
    in_flight: SendResult  # read by the frozen relay, not handed over


def freeze_after_read(cluster: Cluster, point: str = "relay_after_fetch") -> FrozenRelay:
    """Hosts A and B (machine B1, lease 3 s); A's planner sends worker@B one message, which
    B1's relay reads and then freezes on (at ``point``: before handing it over, or
    ``relay_before_ack``, after)."""
    a = cluster.host("A", remote_ack_wait_s=1)
    old = cluster.host("B", relay=False, dirname="B1", lease_s=3)
    old.env[FAULTS_ENV] = f"stop:{point}"
    old.start_relay()
    relay = old.relay
    assert relay is not None
    old_worker = old.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")
    in_flight = planner.send("worker@B", "read, then frozen")
    assert in_flight.outcome.value == "queued", in_flight
    wait_for(lambda: stopped(relay.pid), 30, "the old relay to freeze after its read")
    return FrozenRelay(a, old, relay, old_worker, planner, in_flight)


def thaw(frozen: FrozenRelay, timeout: float = 60) -> str:
    """Resume the frozen relay: it finds its host taken over and exits, having handed nothing
    over on its machine. Returns its log."""
    frozen.relay.send_signal(signal.SIGCONT)
    assert frozen.relay.wait(timeout) != 0
    log = frozen.old.relay_log()
    assert "took over" in log, log[-2000:]
    assert frozen.old.inbox("worker") == Counter()
    assert frozen.old_worker.message_ids() == Counter()
    return log
