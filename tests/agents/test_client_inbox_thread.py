"""`Client.inbox` touched from the caller's thread must not break later deliveries.

The loop thread saves every delivery to the inbox before acknowledging it. If the caller's
thread opened that SQLite connection first, the save failed on the loop thread: the sender saw
`queued` instead of `delivered`, and a reconnecting client crash-looped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from crossintercom.client import Client, Identity
from crossintercom.models import Outcome
from tests.conftest import settings_for


@pytest.fixture
def cfg(cli_env: dict[str, str]) -> Any:
    return settings_for(cli_env)


@pytest.fixture
def clients(cfg: Any) -> Iterator[list[Client]]:
    made: list[Client] = []
    yield made
    for c in made:
        c.close()


def _named(cfg: Any, clients: list[Client], name: str, **kw: Any) -> Client:
    c = Client(cfg, Identity.named(cfg, name), **kw).connect()
    clients.append(c)
    return c


@pytest.mark.parametrize("reconnect", [False, True])
def test_inbox_from_caller_thread_keeps_deliveries_working(
    cfg: Any, clients: list[Client], reconnect: bool
) -> None:
    worker = _named(cfg, clients, "worker", reconnect=reconnect)
    planner = _named(cfg, clients, "planner")
    assert worker.inbox.transcript() == []  # opened on this (the caller's) thread

    for n in range(3):
        result = planner.send("worker", f"hello {n}")
        assert result.outcome is Outcome.DELIVERED, result
    ids = [e.id for e in worker.inbox.transcript() if e.kind == "message"]
    assert len(ids) == 3
    assert worker.aio.connected.is_set()
