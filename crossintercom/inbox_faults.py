"""Whether a session's inbox can be read and written right now, as the process using it sees it.

A full disk or a read-only (immutable) inbox file makes SQLite fail. Every ``Inbox`` operation
that fails records the fault here (what failed, since when, the error) and raises
``InboxUnavailable``; the next operation of the same kind that works clears it. A client reports
each change to its broker, so ``status`` names the fault while it lasts (docs/reliability.md,
"A session's inbox fails").
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Concatenate, Final, Literal, ParamSpec, Protocol, TypeVar

import tenacity

from crossintercom.errors import InboxUnavailable

log = logging.getLogger(__name__)

Op = Literal["read", "write"]
READ: Final = "read"
WRITE: Final = "write"
# What a failing inbox raises: SQLite's I/O, full, read-only and locked errors, and the OS's.
FAULTS: Final = (sqlite3.OperationalError, OSError)


@dataclass(frozen=True, slots=True)
class Fault:
    op: Op
    since: float  # wall clock, when the first of this run of failures happened
    error: str


class InboxFaults:
    """The current faults of one inbox; ``on_change`` is called when one starts or ends."""

    def __init__(self) -> None:
        self.current: dict[Op, Fault] = {}
        self.on_change: Callable[[], None] | None = None

    def failed(self, op: Op, exc: BaseException) -> InboxUnavailable:
        """Record a failure; returns the error to raise."""
        error = str(exc) or type(exc).__name__
        if op not in self.current:
            log.error("the inbox cannot be %s: %s; retrying", _done(op), error)
            self.current[op] = Fault(op, time.time(), error)
            self._changed()
        return unavailable(op, error)

    def ok(self, op: Op) -> None:
        if self.current.pop(op, None) is not None:
            log.warning("the inbox can be %s again", _done(op))
            self._changed()

    def error(self) -> InboxUnavailable | None:
        """The error for the earliest fault now; None when the inbox works."""
        if not self.current:
            return None
        first = min(self.current.values(), key=lambda f: f.since)
        return unavailable(first.op, first.error)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


def _done(op: Op) -> str:
    return "read" if op == READ else "written"


def unavailable(op: Op, error: str) -> InboxUnavailable:
    return InboxUnavailable(
        f"the session's inbox cannot be {_done(op)} right now ({error}); nothing was lost, "
        "and mail is saved and shown once it can"
    )


class _HasFaults(Protocol):
    faults: InboxFaults


S = TypeVar("S", bound=_HasFaults)
P = ParamSpec("P")
T = TypeVar("T")


def guarded(
    op: Op,
) -> Callable[[Callable[Concatenate[S, P], T]], Callable[Concatenate[S, P], T]]:
    """An ``Inbox`` method whose SQLite or OS failure is recorded and raised as
    ``InboxUnavailable``, and whose success clears the fault of its kind."""

    def wrap(fn: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], T]:
        @functools.wraps(fn)
        def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
            try:
                out = fn(self, *args, **kwargs)
            except FAULTS as exc:
                raise self.faults.failed(op, exc) from exc
            self.faults.ok(op)
            return out

        return run

    return wrap


# How a surface waits between tries while its inbox fails: soon at first, then every 2 s at
# most, so mail shows within seconds of the fault clearing (docs/reliability.md).
RETRY_WAIT: Final = tenacity.wait_exponential(multiplier=0.1, min=0.1, max=2.0)


def retrying(stopped: Callable[[], bool]) -> tenacity.AsyncRetrying:
    """Retry a step that raised ``InboxUnavailable`` until it works; once ``stopped()`` (the
    surface is asked to end) the last error is raised instead."""
    return tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type(InboxUnavailable),
        wait=RETRY_WAIT,
        stop=lambda _state: stopped(),
        reraise=True,
    )


async def steady(step: Callable[[], Awaitable[T]], stopped: Callable[[], bool]) -> T | None:
    """``step()``, tried again with backoff while the inbox fails (each failure is already
    recorded and logged); None if the surface is asked to end first."""
    with contextlib.suppress(InboxUnavailable):
        return await step()  # the usual case: no retry machinery on a surface's hot path
    try:
        async for attempt in retrying(stopped):
            with attempt:
                return await step()
    except InboxUnavailable:
        pass
    return None


async def steady_call(fn: Callable[[], T], stopped: Callable[[], bool]) -> T | None:
    """``steady`` for a blocking step on the inbox."""

    async def step() -> T:
        return fn()

    return await steady(step, stopped)
