"""The page's host list (docs/web.md, "Hosts"): each host's lease state and when its heartbeat
last moved. The store stamps that time itself (``HostRow.beat_age_s``, the database's clock),
so a page started after a host died shows for how long at once; a store from before that stamp
leaves it to this page's own sight of the counter moving, as relays judge leases."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from crossintercom.storage import HostRow, LeaseTracker


class HostLeases:
    def __init__(self, lease_s: float, heartbeat_s: float, drop_after: float) -> None:
        self.leases = LeaseTracker(lease_s, heartbeat_s=heartbeat_s)
        self.drop_after = drop_after
        self._seen: dict[str, tuple[tuple[int, int], float]] = {}  # host -> (beat, seen at)

    def view(self, rows: Iterable[HostRow], now: float) -> tuple[list[dict[str, Any]], set[str]]:
        """The hosts to list, and those left out: lapsed for ``drop_after`` past their lease
        (history and filters still find them)."""
        rows = list(rows)
        self.leases.observe(rows)
        listed: list[dict[str, Any]] = []
        dropped: set[str] = set()
        for row in rows:
            beat = (row.generation, row.heartbeat)
            if self._seen.get(row.host_id, ((-1, -1), 0.0))[0] != beat:
                self._seen[row.host_id] = (beat, now)
            if row.beat_age_s is not None:
                beat_at = now - row.beat_age_s
                stale = row.beat_age_s >= self.leases.lease_s
            else:
                beat_at, stale = self._seen[row.host_id][1], False
            lapsed = self.leases.lapsed(row.host_id) or stale
            if lapsed and now - beat_at - self.leases.lease_s >= self.drop_after:
                dropped.add(row.host_id)
                continue
            listed.append(
                {
                    "host": row.host_id,
                    "generation": row.generation,
                    "heartbeat": row.heartbeat,
                    "beat_at": iso(beat_at),
                    "lease": "lapsed" if lapsed else "held",
                }
            )
        return listed, dropped


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
