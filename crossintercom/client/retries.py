"""How the client rides out a lost broker: an operation retried with its one message id (and
what it reports when the retries run out), and the schedule a listening client reconnects on.
Neither knows the client: each is handed the calls that connect and ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import tenacity

from crossintercom import protocol as p
from crossintercom.errors import (
    BrokerUnavailable,
    Code,
    CrossintercomError,
    Disconnected,
    RemoteError,
)
from crossintercom.models import Outcome, SendResult

log = logging.getLogger(__name__)
T = TypeVar("T")

OPERATION_DEADLINE_S = 660.0
RETRY_WAITS_S = (1.0, 2.0, 5.0)
RECONNECT_WAITS_S = (1.0, 2.0, 5.0, 10.0, 30.0)
_RECOVERABLE = (Disconnected, BrokerUnavailable)
# After an inbox write failed, register again this long after, to be handed the message again.
SAVE_RETRY_S = 5.0


async def with_retries(
    msg_id: str,
    connect: Callable[[], Awaitable[None]],
    request: Callable[[], Awaitable[p.BrokerFrame]],
) -> p.BrokerFrame | SendResult:
    """The broker's answer to ``request``, retried after recoverable disconnects; a
    ``SendResult`` instead when there is none (not sent, unknown, or refused)."""
    # A plain loop, not a retry library: the first attempt, which nearly every operation is,
    # then costs nothing beyond the request itself (docs/performance.md).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OPERATION_DEADLINE_S
    maybe_sent = False
    waits = iter(RETRY_WAITS_S)
    while True:
        try:
            await connect()
            try:
                async with asyncio.timeout_at(deadline):
                    return await request()
            except Disconnected as exc:
                # Lost before the frame was written: that attempt sent nothing.
                maybe_sent = maybe_sent or exc.details.get("written", True)
                raise
        except _RECOVERABLE as exc:
            wait = next(waits, None)
            if wait is None or loop.time() + wait >= deadline:
                if maybe_sent:
                    return SendResult(msg_id, Outcome.UNKNOWN, Code.DISCONNECTED, str(exc))
                return SendResult(msg_id, Outcome.NOT_SENT, Code.BROKER_UNAVAILABLE, exc.message)
            await asyncio.sleep(wait)
        except TimeoutError:
            return SendResult(msg_id, Outcome.UNKNOWN, Code.DEADLINE, "no outcome within 11 min")
        except RemoteError as exc:
            return SendResult.refused(msg_id, exc.code, exc.message)


def _log_reconnect(state: tenacity.RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    log.warning("reconnect attempt %d failed: %s", state.attempt_number, exc)


async def reconnect_forever(
    connect: Callable[[], Awaitable[None]], closed: Callable[[], bool]
) -> None:
    """1, 2, 5, 10, then every 30 s, until ``connect`` works or the client closes."""
    chain = tenacity.wait_chain(*[tenacity.wait_fixed(w) for w in RECONNECT_WAITS_S])

    def waits(state: tenacity.RetryCallState) -> float:
        # A broker that cannot write its files is up: retry soon, mail resumes in seconds.
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, RemoteError) and exc.code == Code.LOCAL_STORAGE:
            return SAVE_RETRY_S
        return float(chain(state))

    # Any error is retried, a refusal by the broker too (it may come from a fault that
    # passes, such as a full disk): a client that gave up would never receive again.
    retrying = tenacity.AsyncRetrying(
        wait=waits,
        retry=tenacity.retry_if_exception(
            lambda e: isinstance(e, CrossintercomError) and not closed()
        ),
        stop=tenacity.stop_never,
        before_sleep=_log_reconnect,
        reraise=True,
    )
    with contextlib.suppress(CrossintercomError):  # only once the client was closed
        async for attempt in retrying:
            with attempt:
                await connect()


async def await_reply(
    waiter: asyncio.Future[T],
    timeout: float,
    connect: Callable[[], Awaitable[None] | None],
) -> T:
    """Wait for an ask's reply; ``connect()`` gives a registration to make first when the
    client should re-register itself (else None), so the new broker can still hand it the
    reply (live, or from the queue) instead of the ask waiting out its timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not waiter.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise TimeoutError
        pause = 0.5
        registering = connect()
        if registering is not None:
            try:
                await asyncio.wait_for(registering, remaining)
            except CrossintercomError:
                pause = 1.0  # no broker yet: try again shortly
        await asyncio.wait({waiter}, timeout=min(pause, max(0.0, deadline - loop.time())))
    return waiter.result()
