"""``relay --require-sync-replication``: acknowledge nothing unless the store's server
replicates synchronously (docs/operations.md, "High availability").

Checked before the relay starts (it refuses to, naming the fix) and every CHECK_EVERY_S while
it runs: once the server stops replicating synchronously (its synchronous standby names
cleared, synchronous_commit lowered, its last standby gone), the relay stops with an error, so
sends to other hosts are `not_sent` (or queued on this host) rather than acknowledged on a
server whose failover could lose them. A server that cannot be asked right now is the store
fault the relay already rides out, not a reason to stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from crossintercom.errors import StoreError
from crossintercom.relay.service import RelayError
from crossintercom.storage.replication import replication
from crossintercom.storage.urls import mask_url

log = logging.getLogger(__name__)

ENV_REQUIRE_SYNC = "CROSSINTERCOM_REQUIRE_SYNC_REPLICATION"
CHECK_EVERY_S = 5.0


def refusal(url: str) -> str | None:
    """Why the store does not qualify now, or None (also None when it cannot be asked)."""
    try:
        found = replication(url)
    except StoreError:
        return None
    if found.mode == "synchronous":
        return None
    return (
        f"the store {mask_url(url)} does not replicate synchronously ({found.mode}: "
        f"{found.says}), and this relay requires it (--require-sync-replication, "
        f"{ENV_REQUIRE_SYNC}); set synchronous_standby_names to a connected standby with "
        "synchronous_commit=on, or run the relay without the requirement"
    )


def check_at_start(url: str) -> None:
    why = refusal(url)
    if why is not None:
        raise RelayError(why)


async def watch(url: str, stop: Callable[[], None], failed: list[str]) -> None:
    """Until cancelled: stop the relay (``stop``) once the store no longer qualifies; the
    reason goes into ``failed``."""
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        why = await asyncio.to_thread(refusal, url)
        if why is not None:
            log.error("%s; stopping", why)
            failed.append(why)
            stop()
            return
