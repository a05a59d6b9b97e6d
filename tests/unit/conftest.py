"""The unit tier's rules, enforced: a test here runs in this process and waits for nothing. It
starts no process, opens no server or connection (a network or Unix socket) and sleeps no time;
each of those is refused while the test runs, and a test that tried one fails even if the code
under test swallowed the error. A test that needs any of them belongs to the integration tier
(CONTRIBUTING.md, "Test tiers")."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest


class UnitTierViolation(AssertionError):
    """What a unit test did that its tier does not allow."""


class TierGuard:
    """The calls a unit test may not make, patched for the length of one test."""

    def __init__(self) -> None:
        self.violations: list[str] = []

    def refuse(self, what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            self.violations.append(what)
            raise UnitTierViolation(f"a unit test may not {what} (tests/unit/conftest.py)")

        return refused

    def install(self, mp: pytest.MonkeyPatch) -> None:
        refused_popen = self.refuse("start a process (subprocess)")

        class RefusedPopen(subprocess.Popen[bytes]):
            # A class, not a function: modules imported during a test subscript it in their
            # annotations (``subprocess.Popen[bytes]``).
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                refused_popen(*args, **kwargs)

        mp.setattr(subprocess, "Popen", RefusedPopen)
        mp.setattr(os, "fork", self.refuse("fork"))
        mp.setattr(os, "posix_spawn", self.refuse("start a process (posix_spawn)"))
        mp.setattr(asyncio, "create_subprocess_exec", self.refuse("start a process (asyncio)"))
        mp.setattr(asyncio, "create_subprocess_shell", self.refuse("start a process (asyncio)"))
        mp.setattr(socket.socket, "connect", self.refuse("connect a socket"))
        mp.setattr(socket.socket, "connect_ex", self.refuse("connect a socket"))
        mp.setattr(socket.socket, "bind", self.refuse("bind a socket (a server)"))
        mp.setattr(socket, "create_connection", self.refuse("connect a socket"))
        real_sleep = asyncio.sleep
        refused_sleep = self.refuse("sleep (wait for a fact, or move the test)")

        def sleep(delay: float) -> None:
            refused_sleep(delay)

        async def async_sleep(delay: float, result: Any = None) -> Any:
            # sleep(0) yields one loop turn, which is not waiting for time.
            if delay > 0:
                refused_sleep(delay)
            return await real_sleep(0, result)

        mp.setattr(time, "sleep", sleep)
        mp.setattr(asyncio, "sleep", async_sleep)


@pytest.fixture(autouse=True)
def unit_tier_guard() -> Iterator[TierGuard]:
    guard = TierGuard()
    with pytest.MonkeyPatch.context() as mp:
        guard.install(mp)
        yield guard
    if guard.violations:
        pytest.fail(f"the unit tier's rules were broken: {', '.join(guard.violations)}")
