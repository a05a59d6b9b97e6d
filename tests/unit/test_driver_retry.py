"""``Driver.run``'s bounded reconnect: only a lost connection (``StoreUnavailable``) is tried
again, ``ATTEMPTS`` times in all, waiting ``BACKOFF_S`` and then twice that between attempts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from crossintercom.errors import StoreError, StoreUnavailable
from crossintercom.storage import driver as d
from crossintercom.storage.urls import parse_store_url


class Flaky(d.Driver):
    """Fails the first ``failures`` attempts with ``error``."""

    def __init__(self, failures: int, error: Exception) -> None:
        super().__init__(parse_store_url("sqlite:///unused.db"))
        self.failures, self.error, self.attempts = failures, error, 0

    async def _once(self, op: d.Op[Any]) -> Any:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise self.error
        return "done"


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return slept


def test_a_lost_connection_is_tried_again_with_growing_waits(waits: list[float]) -> None:
    flaky = Flaky(d.ATTEMPTS - 1, StoreUnavailable("lost"))
    assert asyncio.run(flaky.run(lambda c: None)) == "done"
    assert flaky.attempts == d.ATTEMPTS
    assert waits == [d.BACKOFF_S, 2 * d.BACKOFF_S]


def test_the_last_failure_is_raised_after_every_attempt(waits: list[float]) -> None:
    flaky = Flaky(d.ATTEMPTS, StoreUnavailable("still lost"))
    with pytest.raises(StoreUnavailable, match="still lost"):
        asyncio.run(flaky.run(lambda c: None))
    assert flaky.attempts == d.ATTEMPTS and len(waits) == d.ATTEMPTS - 1


def test_other_errors_and_retry_false_are_not_tried_again(waits: list[float]) -> None:
    other = Flaky(1, StoreError("refused"))
    with pytest.raises(StoreError, match="refused"):
        asyncio.run(other.run(lambda c: None))
    once = Flaky(1, StoreUnavailable("lost"))
    with pytest.raises(StoreUnavailable):
        asyncio.run(once.run(lambda c: None, retry=False))
    assert (other.attempts, once.attempts, waits) == (1, 1, [])


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [d.backoff_s(n) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]
    assert d.backoff_s(20) == d.BACKOFF_MAX_S
