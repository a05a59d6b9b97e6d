"""``pg_failover``: the store's standby is promoted under traffic and the old primary stops (as
a crash); a moment later the old primary comes back as a standby of the new one (pg_rewind).

Only on a run's own primary + standby (``--own-postgres --faults pg_failover``, tools.pgreplica):
the relays' store URL names both hosts with ``target_session_attrs=read-write``, so every
reconnect goes to whichever is the primary. Its log entry says how long the promotion took,
how long until mail flowed again (a message sent after the fault began, acknowledged and in
its recipient's inbox) and how long the rejoin took; lost, duplicated and phantom ``not_sent``
are counted under it like under every fault kind (report.by_fault).
"""

from __future__ import annotations

import time
from typing import Any

from crossintercom.tools.chaos.state import ACKNOWLEDGED, ChaosState, read_sink
from crossintercom.tools.pgreplica import ReplicatedPostgres

# How long to wait for mail to flow again before saying it did not (the run goes on).
FLOWS_DEADLINE_S = 60.0
# When the old primary comes back as a standby, after the promotion.
REJOIN_AFTER_S = (1.0, 3.0)


def flows_again(
    state: ChaosState, since: float, deadline_s: float = FLOWS_DEADLINE_S
) -> float | None:
    """Seconds from ``since`` (run time) until a message sent after it was acknowledged and
    saved by its recipient; None past the deadline."""
    end = time.monotonic() + deadline_s
    by_host = {h.host_id: h for h in state.hosts}
    while time.monotonic() < end:
        after = [s for s in state.sent if s.t >= since and s.outcome in ACKNOWLEDGED]
        for host_id in {s.recipient_host for s in after}:
            held = {mid for mid, _ in read_sink(by_host[host_id])}
            if any(s.id in held for s in after if s.recipient_host == host_id):
                return round(state.now() - since, 2)
        time.sleep(0.05)
    return None


def fail_over(state: ChaosState, replica: ReplicatedPostgres) -> dict[str, Any] | None:
    """Blocking: promote, stop the old primary, wait for mail. None while there is no standby
    (the previous failover's old primary has not rejoined yet)."""
    if replica.standby is None:
        return None
    since = state.now()
    promote_s = replica.fail_over()
    return {
        "host": "all",
        "promote_s": round(promote_s, 2),
        "old_stopped_s": round(replica.stopped_after_s, 3),
        "flows_again_s": flows_again(state, since),
        "synchronous": replica.synchronous,
        "failover": replica.failovers,  # which one: its rejoin is noted in this entry
    }


def rejoin(state: ChaosState, replica: ReplicatedPostgres, n: int) -> None:
    """Blocking: the old primary back as a standby; how long it took (or why it failed) goes
    into the log entry of failover ``n``."""
    found: dict[str, Any] = {}
    try:
        found["rejoin_s"] = round(replica.rejoin(), 2)
        found["rejoined_by"] = "pg_basebackup" if replica.rewind_error else "pg_rewind"
    except Exception as exc:
        found["rejoin_error"] = str(exc)[:500]
        raise
    finally:
        for entry in state.fault_log:
            if entry["fault"] == "pg_failover" and entry.get("failover") == n:
                entry.update(found)
