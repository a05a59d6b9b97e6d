"""What the benchmark sends: how many messages each path gets, and their text."""

from __future__ import annotations

from dataclasses import dataclass

TEXT_PAD = "x" * 100


@dataclass(frozen=True)
class Counts:
    same_latency: int
    cross_latency: int
    same_throughput: int
    cross_throughput: int
    raw_latency: int
    raw_rows: int
    senders: int = 4
    receivers: int = 2
    window: int = 16
    batch: int = 500

    @classmethod
    def for_run(cls, quick: bool) -> Counts:
        if quick:
            return cls(40, 30, 400, 400, 200, 4000)
        return cls(1000, 500, 5000, 5000, 2000, 50_000)


def text(i: int) -> str:
    """The ``i``-th message text: the same size on every path, crossintercom and raw alike."""
    return f"bench {i:07d} {TEXT_PAD}"
