"""The per-sender rate limit as a pure rule: a window of N new message ids per sender."""

from __future__ import annotations

from crossintercom.local_broker.delivery.ratelimit import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_window_counts_new_ids_per_sender_and_frees_up() -> None:
    clock = Clock()
    limiter = RateLimiter(2, 10.0, clock)
    assert limiter.admit("a", "m1") and limiter.admit("a", "m2")
    assert not limiter.admit("a", "m3")
    assert limiter.admit("a", "m1"), "a retry of a counted id is not a new message"
    assert limiter.admit("b", "m3"), "another sender has its own window"
    clock.now += 5.0
    assert not limiter.admit("a", "m3")
    clock.now += 5.0  # m1 and m2 are now a whole window old
    assert limiter.admit("a", "m3") and limiter.admit("a", "m4")
    assert not limiter.admit("a", "m5")
    assert "2 messages in 10 s" in limiter.why()


def test_idle_senders_are_forgotten() -> None:
    clock = Clock()
    limiter = RateLimiter(1, 1.0, clock)
    for n in range(10_001):
        assert limiter.admit(f"s{n}", "m")
    clock.now += 2.0
    assert limiter.admit("late", "m")
    assert limiter.senders == 1
