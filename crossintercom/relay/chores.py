"""The relay's periodic work, carried by its heartbeat: the look for sessions holding up the
store (``stuck_check_s``), the housekeeping (``housekeeping_s``: expiry, purge, the host's
dead reservations) when they are due and, at every beat while metrics are served, their
counts of the mail waiting and the host's reservations run inside the heartbeat's own
transaction, so an idle relay commits once a heartbeat and nothing else (docs/storage.md,
"Idle load"). The beat proves the relay current before they run, as the fence they need (a
relay frozen past a takeover must not expire or purge). What they find past one batch is
finished afterwards in transactions of their own, as before: then the relay is not idle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from crossintercom.errors import StoreError, StoreUnavailable
from crossintercom.relay.core import RelayCore
from crossintercom.relay.stuck import STUCK_IDLE_S, StuckWatch
from crossintercom.storage import Beat
from crossintercom.storage.interface import Chore

log = logging.getLogger(__name__)

BeatFn = Callable[[Sequence[Chore]], Awaitable[Beat | None]]


class Chores:
    def __init__(self, relay: RelayCore, stuck: StuckWatch, beat: BeatFn) -> None:
        self.relay = relay
        self.stuck = stuck
        self._beat = beat
        self._housekeeping_due = time.monotonic() + relay.settings.housekeeping_s

    async def beat(self, *, count: bool = False) -> Beat | None:
        """One heartbeat, with the chores that are due in its transaction; None when fenced.
        ``count``: the metrics' reads of the store too (``counts_chore``), into ``metrics``."""
        relay, store = self.relay, self.relay.store
        look = self.stuck.due()
        now = time.monotonic()
        house = now >= self._housekeeping_due
        if house:
            self._housekeeping_due = now + relay.settings.housekeeping_s
        keep = relay.settings.purge_after_s
        chores: list[Chore] = [store.stuck_chore(STUCK_IDLE_S)] if look else []
        if count:
            chores.append(store.counts_chore(relay.host, relay.generation))
        if house:
            chores += [
                store.expire_chore(),
                store.purge_chore(keep),
                store.sweep_chore(relay.host, relay.generation),
            ]
        if not chores:
            return await self._beat(())
        try:
            beat = await self._beat(chores)
        except StoreUnavailable:
            raise  # the store away: the heartbeat loop reports it
        except StoreError as exc:
            # A chore failed, and the beat with it: the beat alone now, so a failing chore
            # never stops the lease; the chores come again at their next time.
            log.warning("housekeeping failed: %s", exc.message, extra={"error": exc.message})
            return await self._beat(())
        if beat is None:
            return None
        done = list(beat.chores)
        if look:
            self.stuck.seen(done.pop(0))
        if count:
            queued, reserved = done.pop(0)
            relay.metrics.queued(queued)
            relay.metrics.reserved(reserved)
        if house:
            expired, (purged, receipts), _swept = done
            if expired or purged or receipts:
                relay.spawn(self._rest(keep))
        return beat

    async def _rest(self, keep: float) -> None:
        """Housekeeping found work: what is left of it, in bounded transactions."""
        store = self.relay.store
        try:
            await store.expire()
            await store.purge(older_than_s=keep)
        except StoreError as exc:
            log.warning("housekeeping failed: %s", exc.message, extra={"error": exc.message})
