"""Crash points for the fault tests (docs/reliability.md). Test-only: never set in production.

``CROSSINTERCOM_FAULTS`` names comma-separated points; a process that reaches one SIGKILLs
itself there, so a test can stop the broker or a client between two durable steps. The variable
is read once per process: the points cost one set lookup on the hot path.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from typing import Final

FAULTS_ENV: Final = "CROSSINTERCOM_FAULTS"

log = logging.getLogger(__name__)


@functools.cache
def _armed() -> frozenset[str]:
    return frozenset(p for p in os.environ.get(FAULTS_ENV, "").split(",") if p)


def crash_at(point: str) -> None:
    if point in _armed():
        log.warning("fault injection: killing the process", extra={"point": point})
        os.kill(os.getpid(), signal.SIGKILL)
