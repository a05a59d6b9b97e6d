from __future__ import annotations

from crossintercom.storage import HostRow, LeaseTracker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lapse_is_judged_on_the_observers_clock() -> None:
    clock = Clock()
    tracker = LeaseTracker(lease_s=15, clock=clock)
    assert tracker.lapsed("a")  # never seen
    tracker.observe([HostRow("a", 1, 0), HostRow("b", 1, 0)])
    assert tracker.alive("a") and tracker.alive("b")
    clock.now += 10
    tracker.observe([HostRow("a", 1, 1), HostRow("b", 1, 0)])  # only a's counter moved
    clock.now += 6
    assert tracker.alive("a") and tracker.lapsed("b")
    assert tracker.alive_hosts() == {"a"}
    tracker.observe([HostRow("a", 1, 1), HostRow("b", 2, 0)])  # a new relay generation counts
    assert tracker.alive("b")
    clock.now += 15
    assert tracker.lapsed("a") and tracker.lapsed("b")
