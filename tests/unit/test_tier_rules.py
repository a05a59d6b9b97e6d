"""The unit tier refuses what would make it slow or flaky (tests/unit/conftest.py): a process,
a socket to or for a server, a sleep. Each is refused as a test here would meet it, and the
test that met it fails even when the code under test caught the error."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.conftest import TierGuard, UnitTierViolation


def _run_process() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=False)


def _run_async_process() -> None:
    async def spawn() -> None:
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")

    asyncio.run(spawn())


def _connect() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.connect(("127.0.0.1", 5432))


def _serve() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind("\0unit-tier")


def _async_sleep() -> None:
    asyncio.run(asyncio.sleep(0.01))


@pytest.mark.parametrize(
    "act",
    [_run_process, _run_async_process, _connect, _serve, lambda: time.sleep(0.01), _async_sleep],
    ids=["subprocess", "asyncio-subprocess", "connect", "bind", "sleep", "asyncio-sleep"],
)
def test_each_forbidden_call_is_refused_and_recorded(
    act: Callable[[], Any], unit_tier_guard: TierGuard
) -> None:
    with pytest.raises(UnitTierViolation):
        act()
    assert len(unit_tier_guard.violations) == 1
    unit_tier_guard.violations.clear()  # seen: this test itself must not fail at teardown


def test_a_refusal_the_code_swallowed_is_still_recorded(unit_tier_guard: TierGuard) -> None:
    with contextlib.suppress(Exception):
        _run_process()
    assert unit_tier_guard.violations == ["start a process (subprocess)"]
    unit_tier_guard.violations.clear()


def test_a_loop_turn_is_not_a_sleep() -> None:
    asyncio.run(asyncio.sleep(0))


def test_every_end_to_end_file_named_exists() -> None:
    """A renamed whole-system test would silently fall back to the integration tier."""
    from tests.conftest import E2E_DIRS, E2E_FILES, TESTS

    missing = [n for n in sorted(E2E_FILES | E2E_DIRS) if not (TESTS / n).exists()]
    assert not missing, f"tests/conftest.py names end-to-end tests that do not exist: {missing}"
