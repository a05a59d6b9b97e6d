"""Name retirement: a durable session with no activity for ``retire_idle_s`` (0, the default:
never) is forgotten by the broker's sweep, as ``forget`` would: its queued and held mail
expires with receipts (code ``forgotten``), its inbound rules go, asks waiting for its reply
are told, other hosts stop listing it (docs/agents.md#name-retirement).

Activity is being held by a live connection or changed (registered, wake policy, groups):
the sweep stamps the sessions live at each pass, so idleness counts from when the last
connection went away.
"""

from __future__ import annotations

import logging
import time

from crossintercom import protocol as p
from crossintercom.local_broker.coord.aftercare import Aftercare
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state.store import BrokerState

log = logging.getLogger(__name__)


def retire_idle(
    state: BrokerState,
    registry: Registry,
    aftercare: Aftercare,
    idle_s: float,
    now: float | None = None,
) -> list[str]:
    """Forget the durable sessions idle longer than ``idle_s``; returns their ids."""
    if idle_s <= 0:
        return []
    at = time.time() if now is None else now
    live = list(registry.live)
    state.db.executemany(
        "UPDATE known_sessions SET updated = ? WHERE id = ?", [(at, s) for s in live]
    )
    idle = [
        sid
        for (sid,) in state.db.execute(
            "SELECT id FROM known_sessions WHERE updated < ?", (at - idle_s,)
        )
        if sid not in registry.live
    ]
    for sid in idle:
        gone = aftercare.forget(p.Forget(0, sid))
        log.info("idle session retired", extra={"session": sid, "expired": gone.expired})
    return idle
