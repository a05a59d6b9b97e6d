"""Sessions holding up the store (PostgreSQL): named in `status` and the log.

A session left idle inside a transaction (a frozen process, a client that never commits) holds
its locks, and every relay's writes to those rows wait behind it until the server ends it
(``idle_in_transaction_session_timeout``, docs/operations.md); a ``LOCK TABLE`` or the
migration lock stalls every host the same way. The relay looks now and then and says who it
is (pid, role, application, how long where PostgreSQL shows it), so an operator can end it.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from crossintercom.errors import StoreError
from crossintercom.relay.core import RelayCore
from crossintercom.storage import StuckTransaction

log = logging.getLogger(__name__)

# Idle in a transaction this long is no relay's own (theirs last milliseconds).
STUCK_IDLE_S: Final = 5.0


def _held(s: StuckTransaction) -> str:
    """How long, where PostgreSQL shows it (docs/operations.md: pg_read_all_stats)."""
    if s.idle_s is None:
        return "for a time this role may not see"
    return f"idle {s.idle_s:.0f} s" if s.kind == "idle" else f"for {s.idle_s:.0f} s"


def describe(stuck: list[StuckTransaction]) -> str | None:
    if not stuck:
        return None
    who = "; ".join(
        f"pid {s.pid} (user {s.user or '?'}, application {s.application or '?'}, from "
        f"{s.client or 'local socket or hidden'}) {_held(s)}, "
        f"{'locks on' if s.kind == 'idle' else 'holding'} {', '.join(s.tables)}"
        for s in stuck
    )
    idle = [s.idle_s for s in stuck if s.kind == "idle" and s.idle_s is not None]
    if idle:
        head = (
            f"another database session has been idle in a transaction for {min(idle):.0f} s "
            "holding locks on the store's tables"
        )
    else:
        head = "another database session holds a lock on the store that relays wait behind"
    return f"WARNING {head}; writes wait behind it: {who}"


class StuckWatch:
    def __init__(self, relay: RelayCore) -> None:
        self.relay = relay
        self._checked = -relay.settings.stuck_check_s
        self._pids: set[int] = set()
        self.warning: str | None = None

    def due(self) -> bool:
        """Whether the next heartbeat should look (every ``stuck_check_s``, in its own
        transaction: ``store.stuck_chore``); counted as looked from now."""
        t = time.monotonic()
        if t - self._checked < self.relay.settings.stuck_check_s:
            return False
        self._checked = t
        return True

    async def check(self, idle_s: float = STUCK_IDLE_S) -> str | None:
        """Look now, on a connection of its own (the heartbeat stalled: the relay's may wait
        behind the very lock this names); the current warning (None: none)."""
        self._checked = time.monotonic()
        try:
            stuck = await self.relay.store.stuck_transactions(idle_s)
        except StoreError:
            return self.warning  # the heartbeat reports the outage itself
        return self.seen(stuck)

    def seen(self, stuck: list[StuckTransaction]) -> str | None:
        """What a look found: the current warning (None: none), logged once per session."""
        warning = describe(stuck)
        pids = {s.pid for s in stuck}
        if warning is not None and pids != self._pids:  # logged once per stuck session
            log.warning("%s", warning)
        self._pids, self.warning = pids, warning
        return warning
