"""``relay_takeover``: a host's relay freezes past its lease, the host id moves to another
machine, then the frozen relay wakes up.

The relay is SIGSTOPped (a paused VM); a relay for the same host id starts from another runtime
dir (another machine), waits out the lease (the collision check lets a host id move once its
holder's heartbeat stood still that long) and takes over: it delivers the host's mail on the new
machine. Then the frozen relay is SIGCONTed: fenced by the newer generation, it must hand over,
ack and write nothing and exit. The host stays on the new machine for the rest of the run.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from crossintercom.client import wait_until
from crossintercom.errors import CrossintercomError
from crossintercom.tools.chaos.rogue import host_row_free
from crossintercom.tools.chaos.state import SINK, ChaosState, read_sink
from crossintercom.tools.harness import ListenerProcess, SimHost

# The lease of every host in a run with takeovers: short, so that one takes seconds.
TAKEOVER_LEASE_S = 3.0
# Three heartbeats to a lease (liveness.MIN_LEASE_BEATS).
TAKEOVER_HEARTBEAT_S = 1.0
# How long the new machine may take to deliver its first message before the frozen relay wakes.
FIRST_DELIVERY_S = 10.0
STALE_EXIT_S = 30.0
FREEZE_TRIES = 5
LOCK_WAIT_S = 0.5


@dataclass
class Moved:
    machine: SimHost
    listener: ListenerProcess
    entry: dict[str, Any]


def resume(proc: subprocess.Popen[bytes]) -> None:
    """SIGCONT, unless the process is gone."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGCONT)


def _freeze_outside_transactions(
    state: ChaosState, proc: subprocess.Popen[bytes], host_id: str
) -> bool:
    """SIGSTOP the relay at a moment it holds none of the store's locks, or False (left
    running) after a few tries. Frozen inside a transaction it would hold the host's row (on
    SQLite the whole file) until it runs again: no successor could take over, which is the
    stuck-lock fault (docs/operations.md), not this one."""
    for _ in range(FREEZE_TRIES):
        proc.send_signal(signal.SIGSTOP)
        if host_row_free(state.store.url, host_id, LOCK_WAIT_S):
            return True
        resume(proc)
        time.sleep(LOCK_WAIT_S)
    return False


def take_over(state: ChaosState, i: int) -> Moved | None:
    """Blocking: freeze host ``i``'s relay, bring its host id up on a new machine, wake the
    frozen relay and wait for it to exit. None when the relay could not be frozen outside a
    transaction (it was left running)."""
    old = state.hosts[i]
    stale = old.relay
    assert stale is not None
    setup = state.setup
    started = time.monotonic()
    if not _freeze_outside_transactions(state, stale, old.host_id):
        return None
    frozen_at = state.now()
    n = len(state.machines[old.host_id]) + 1
    new = setup.cluster.host(old.host_id, relay=False, dirname=f"{old.host_id}-m{n}")
    if setup.prepare_home is not None:
        setup.prepare_home(new)
    new.configure(**setup.host_config)
    new.start_relay(wait=False)
    listener = new.listen(SINK)
    try:
        new.wait_relay(timeout=TAKEOVER_LEASE_S + 30)
    except CrossintercomError as exc:
        resume(stale)
        raise CrossintercomError(f"{exc.message}; it said: {new.relay_log()[-2000:]}") from exc
    took_over = time.monotonic() - started
    # The new machine delivers while the old relay is still frozen.
    wait_until(lambda: bool(read_sink(new)), FIRST_DELIVERY_S, 0.1)
    frozen = time.monotonic() - started
    before = {mid for mid, _ in read_sink(old)}
    resume(stale)
    try:
        code: int | None = stale.wait(STALE_EXIT_S)
    except subprocess.TimeoutExpired:
        stale.kill()
        stale.wait(10)
        code = None
    log = old.relay_log(stale)
    # What the old machine saved after the wake, from another host and sent after the freeze,
    # came through its stale relay (its own host's mail goes broker to listener): there must
    # be none. Mail sent earlier may have been handed over before the freeze and saved by a
    # slow listener since, which is no stale hand-over.
    sent_at = {s.id: s.t for s in list(state.sent)}
    late = [
        mid
        for mid, text in read_sink(old)
        if mid not in before
        and f"from={old.host_id}" not in text
        and sent_at.get(mid, frozen_at) >= frozen_at
    ]
    entry = {
        "machine": new.home.name,
        "took_over_s": round(took_over, 2),
        "frozen_s": round(frozen, 2),
        "stale_exit": code,
        # It stopped because it found itself fenced, not for some other reason; a relay
        # frozen while it was still starting (a restart after an earlier fault) wakes before
        # it claimed the host id and is refused it instead, which hands over nothing either.
        "fenced": code not in (None, 0)
        and ("took over" in log or "is in use by another machine" in log),
        "stale_handovers": len(late),
    }
    if not entry["fenced"]:
        entry["stale_log_tail"] = log[-1500:]  # why it stopped otherwise
    return Moved(new, listener, entry)
