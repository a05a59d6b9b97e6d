"""Message ids across hosts: an id the shared store cannot hold is refused by the sender's
broker, and never takes other sessions' mail down with it."""

from __future__ import annotations

import asyncio

import pytest

from crossintercom.client import AsyncClient, Client, Identity
from crossintercom.errors import Code, RemoteError
from crossintercom.models import Outcome, SendResult
from tests.relay.conftest import Cluster


def test_an_id_with_a_control_character_is_refused_and_others_go_on(cluster: Cluster) -> None:
    """A NUL in a message id once failed the relay's whole store write on PostgreSQL: every
    message of other sessions batched with it came back `not_sent` (`store_unavailable`)."""
    a, b = cluster.up("A", "B")
    b.client("worker")
    b.client("other")
    a.wait_sees("worker", "B")
    a.wait_sees("other", "B")

    async def run() -> tuple[list[SendResult], list[SendResult]]:
        mallory = AsyncClient(a.settings, a.identity("mallory"))
        planner = AsyncClient(a.settings, a.identity("planner"))
        await mallory.connect()
        await planner.connect()
        try:
            bad: list[tuple[str, str | None]] = [(f"bad\x00{i}", None) for i in range(5)]
            bad += [("ok-id", "th\x00read"), ("line\nbreak", None), ("sep\u2028", None)]
            answers = await asyncio.gather(
                *(mallory.send("worker", "x", message_id=m, thread_id=t) for m, t in bad),
                *(planner.send("other", f"innocent {i}") for i in range(len(bad))),
            )
        finally:
            await mallory.close()
            await planner.close()
        return answers[: len(bad)], answers[len(bad) :]

    refused, innocent = asyncio.run(run())
    assert [r.outcome for r in innocent] == [Outcome.DELIVERED] * 8
    assert [(r.outcome, r.code) for r in refused] == [(Outcome.REFUSED, Code.BAD_FIELD)] * 8
    assert sum(b.inbox("other").values()) == 8
    assert sum(b.inbox("worker").values()) == 0


def test_a_session_describing_itself_with_a_control_character_hides_no_other(
    cluster: Cluster,
) -> None:
    """A NUL in what a session says of itself (a text column of the roster) would fail its
    host's whole roster publish on PostgreSQL, hiding every other session of the host."""
    a, b = cluster.up("A", "B")
    odd = [a.identity("odd-cwd", cwd="x\x00y"), a.identity("odd-model", model="x\x00y")]
    for ident in [*odd, Identity(id="eph\x00id")]:
        client = Client(a.settings, ident)
        try:
            with pytest.raises(RemoteError) as refused:
                client.connect()
        finally:
            client.close()
        assert refused.value.code == Code.BAD_FIELD, refused.value
    a.client("visible")
    b.wait_sees("visible", "A")
