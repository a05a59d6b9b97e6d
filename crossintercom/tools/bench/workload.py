"""What the benchmark sends: how many messages each path gets, and their text."""

from __future__ import annotations

from dataclasses import dataclass

TEXT_PAD = "x" * 100


@dataclass(frozen=True)
class Counts:
    repeats: int  # rounds of every pair (raw, then crossintercom), alternated
    latency: int  # sequential sends per path per round (raw round trips alike)
    asks: int
    throughput: int  # messages per throughput round, over all senders
    raw_rows: int  # rows per raw batched-claim round
    raw_tx: int  # one-row SQLite transactions per round
    backlog: int  # messages queued for the catch-up after a relay restart
    drains: int  # catch-ups (each with the peer's drain after it); the figure is their median
    scale_sessions: int  # sessions on one broker for --scale
    scale_hosts: int  # simulated hosts on one PostgreSQL for --scale
    scale_quiet_s: int  # the quiet window over which idle commits are counted
    # Consecutive such windows; the figure is their median (a window the server's autovacuum
    # visited is the odd one out: docs/performance.md, "Many hosts on one PostgreSQL").
    scale_quiet_windows: int
    senders: int = 4
    receivers: int = 2
    window: int = 16
    batch: int = 500
    warm_up: int = 10

    @classmethod
    def for_run(cls, quick: bool) -> Counts:
        if quick:
            return cls(2, 20, 5, 160, 1000, 50, 150, 1, 200, 6, 5, 1)
        return cls(5, 300, 100, 3000, 20_000, 1000, 10_000, 3, 1000, 20, 15, 4)


def text(i: int) -> str:
    """The ``i``-th message text: the same size on every path, crossintercom and raw alike."""
    return f"bench {i:07d} {TEXT_PAD}"
