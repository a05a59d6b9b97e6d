"""Judging whether another host's relay is alive, without trusting anyone's clock.

The store keeps only a generation and a heartbeat counter per host. An observer remembers when,
on its own monotonic clock, it last saw either change; a host whose pair has not moved for
``lease_s`` has lapsed. That works on SQLite too, which has no shared clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from crossintercom.storage.interface import HostRow

DEFAULT_LEASE_S = 15.0
# A relay bumps its counter every ``heartbeat_s`` (settings; its one idle commit, a third of
# the default lease: docs/operations.md, "Sizing"). Rosters do not wait for it: a roster hint
# wakes every relay when one changes.
DEFAULT_HEARTBEAT_S = 5.0
# A lease shorter than a few heartbeats would call a live host lapsed whenever one beat is late
# or an observer's read falls between two beats; shorter settings are raised to this many.
MIN_LEASE_BEATS = 3


def effective_lease(lease_s: float, heartbeat_s: float = DEFAULT_HEARTBEAT_S) -> float:
    return max(lease_s, MIN_LEASE_BEATS * heartbeat_s)


@dataclass(slots=True)
class _Seen:
    generation: int
    heartbeat: int
    changed_at: float


class LeaseTracker:
    def __init__(
        self,
        lease_s: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.monotonic,
        *,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    ) -> None:
        self.lease_s = effective_lease(lease_s, heartbeat_s)
        self._clock = clock
        self._seen: dict[str, _Seen] = {}

    def observe(self, rows: Iterable[HostRow]) -> None:
        """Feed one ``hosts()`` snapshot. A host seen for the first time gets a full lease."""
        now = self._clock()
        for row in rows:
            seen = self._seen.get(row.host_id)
            if seen is None or (seen.generation, seen.heartbeat) != (row.generation, row.heartbeat):
                self._seen[row.host_id] = _Seen(row.generation, row.heartbeat, now)

    def lapsed(self, host_id: str) -> bool:
        """True when the host's counter has not moved for ``lease_s`` (or it was never seen)."""
        seen = self._seen.get(host_id)
        return seen is None or self._clock() - seen.changed_at >= self.lease_s

    def alive(self, host_id: str) -> bool:
        return not self.lapsed(host_id)

    def known(self) -> list[str]:
        """Every host seen; a copy taken at once, so another thread may call it (metrics)."""
        return list(self._seen)

    def alive_hosts(self) -> set[str]:
        return {h for h in self._seen if not self.lapsed(h)}

    def lapsed_hosts(self) -> set[str]:
        """The hosts seen whose counter has since stood still for ``lease_s`` (a host not seen
        yet is not among them: its row is newer than the last observation)."""
        return {h for h in self._seen if self.lapsed(h)}
