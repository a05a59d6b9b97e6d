"""Fixtures of the broker's crash and fault tests (test_crash_points*.py): brokers started
with a fault point, and clients closed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from crossintercom.client import Client, Identity
from crossintercom.config import Settings
from tests.conftest import settings_for
from tests.procs import BrokerProc


@pytest.fixture
def cfg(cli_env: dict[str, str]) -> Settings:
    settings: Settings = settings_for(cli_env)
    return settings


@pytest.fixture
def brokers() -> Iterator[list[BrokerProc]]:
    started: list[BrokerProc] = []
    yield started
    for b in started:
        b.stop()


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    opened: list[Client] = []

    def connect(cfg: Settings, name: str, **kw: Any) -> Client:
        c = Client(cfg, Identity.named(cfg, name), **kw).connect()
        opened.append(c)
        return c

    yield connect
    for c in reversed(opened):
        c.close()
