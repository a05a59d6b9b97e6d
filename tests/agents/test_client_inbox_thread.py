"""`Client.inbox` touched from the caller's thread must not break later deliveries.

The loop thread saves every delivery to the inbox before acknowledging it. If the caller's
thread opened that SQLite connection first, the save failed on the loop thread: the sender saw
`queued` instead of `delivered`, and a reconnecting client crash-looped.
"""

from __future__ import annotations

import pytest

from crossintercom.client import Client, Identity
from crossintercom.models import Outcome
from tests.conftest import settings_for


@pytest.mark.parametrize("reconnect", [False, True])
def test_inbox_from_caller_thread_keeps_deliveries_working(
    cli_env: dict[str, str], reconnect: bool
) -> None:
    cfg = settings_for(cli_env)
    with (
        Client(cfg, Identity.named(cfg, "worker"), reconnect=reconnect) as worker,
        Client(cfg, Identity.named(cfg, "planner")) as planner,
    ):
        assert worker.inbox.transcript() == []  # opened on this (the caller's) thread
        for n in range(3):
            result = planner.send("worker", f"hello {n}")
            assert result.outcome is Outcome.DELIVERED, result
        assert len([e for e in worker.inbox.transcript() if e.kind == "message"]) == 3
        assert worker.aio.connected.is_set()
