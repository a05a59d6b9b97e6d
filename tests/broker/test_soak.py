"""Randomized crash soak: the broker is SIGKILLed at seeded random moments while four sessions
exchange a few thousand messages; the checker proves 0 lost acknowledged messages and 0
duplicates in any inbox (docs/delivery.md). More: ``python -m tests.soak --messages N --kills M``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tests import soak
from tests.procs import sigkill_broker


def test_soak_broker_killed_at_random_moments() -> None:
    home = Path(tempfile.mkdtemp(prefix="cf-", dir="/tmp"))
    try:
        report = soak.run_soak(home, messages=2400, sessions=4, kills=6, seed=20240607)
    finally:
        sigkill_broker(home)
        shutil.rmtree(home, ignore_errors=True)
    print(report.summary())
    assert report.attempted == 2400
    assert report.problems == []
    assert report.lost == 0
    assert report.duplicated == 0
    assert report.phantom == 0
    assert report.kills == 6
    # The kills really cut operations short, and most messages still went through.
    assert report.acknowledged > 0
    assert report.outcomes["refused"] == 0
