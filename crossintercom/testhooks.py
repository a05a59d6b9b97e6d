"""Crash points for the fault tests (docs/reliability.md). Test-only: never set in production.

``CROSSINTERCOM_FAULTS`` names comma-separated points; a process that reaches one SIGKILLs
itself there, so a test can stop the broker or a client between two durable steps. A point named
``stop:POINT`` makes the process SIGSTOP itself at ``stop_at(POINT)`` instead, once, as a paused
VM or a frozen process would stop (the test sends SIGCONT); ``block:POINT`` blocks the thread
that reaches it (an event loop that hangs while its process runs on), once, until the process
is killed. The variable is read once per process: the points cost one set lookup on the hot
path.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from typing import Final

FAULTS_ENV: Final = "CROSSINTERCOM_FAULTS"

log = logging.getLogger(__name__)


@functools.cache
def _armed() -> frozenset[str]:
    return frozenset(p for p in os.environ.get(FAULTS_ENV, "").split(",") if p)


_stopped: set[str] = set()


def stop_at(point: str) -> None:
    if f"stop:{point}" in _armed() and point not in _stopped:
        _stopped.add(point)
        log.warning("fault injection: stopping the process", extra={"point": point})
        os.kill(os.getpid(), signal.SIGSTOP)
    elif f"block:{point}" in _armed() and point not in _stopped:
        _stopped.add(point)
        log.warning("fault injection: blocking the thread", extra={"point": point})
        while True:
            time.sleep(3600)


def crash_at(point: str) -> None:
    if point in _armed():
        log.warning("fault injection: killing the process", extra={"point": point})
        os.kill(os.getpid(), signal.SIGKILL)
