"""Sessions stuck in a transaction on the store (PostgreSQL): named in `status` and the log.

A session left idle inside a transaction (a frozen process, a client that never commits) holds
its locks, and every relay's writes to those rows wait behind it until the server ends it
(``idle_in_transaction_session_timeout``, docs/operations.md). The relay looks now and then and
says who it is, so an operator can end it sooner.
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
CHECK_EVERY_S: Final = 15.0


def describe(stuck: list[StuckTransaction]) -> str | None:
    if not stuck:
        return None
    idle = min(s.idle_s for s in stuck)
    who = "; ".join(
        f"pid {s.pid} (user {s.user or '?'}, application {s.application or '?'}, from "
        f"{s.client or 'local socket'}) idle {s.idle_s:.0f} s, locks on {', '.join(s.tables)}"
        for s in stuck
    )
    return (
        f"WARNING another database session has been idle in a transaction for {idle:.0f} s "
        f"holding locks on the store's tables; writes wait behind it: {who}"
    )


class StuckWatch:
    def __init__(self, relay: RelayCore) -> None:
        self.relay = relay
        self._checked = -CHECK_EVERY_S
        self._pids: set[int] = set()
        self.warning: str | None = None

    async def check(self, idle_s: float = STUCK_IDLE_S, *, now: bool = False) -> str | None:
        """The current warning (None: none), looked up at most every CHECK_EVERY_S unless
        ``now``."""
        t = time.monotonic()
        if not now and t - self._checked < CHECK_EVERY_S:
            return self.warning
        self._checked = t
        relay = self.relay
        try:
            stuck = await relay.hot.stuck_transactions(idle_s)
        except StoreError:
            return self.warning  # the heartbeat reports the outage itself
        warning = describe(stuck)
        pids = {s.pid for s in stuck}
        if warning is not None and pids != self._pids:  # logged once per stuck session
            log.warning("%s", warning)
        self._pids, self.warning = pids, warning
        return warning
