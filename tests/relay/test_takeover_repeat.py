"""The takeover window: a machine's relay handed a message over (its session saved it) and froze
before acknowledging it in the store; the host id moves to another machine, whose relay hands
the same row over again. The second delivery reaches the session flagged `possible_repeat`,
and mail queued after the takeover is not."""

from __future__ import annotations

import signal

from crossintercom.models import POSSIBLE_REPEAT
from tests.relay.conftest import Cluster, Host, wait_for
from tests.relay.frozen import freeze_after_read


def _flags(host: Host, name: str, mid: str) -> list[str] | None:
    with host.open_inbox(name) as inbox:
        found = [e.body.get("flags") or [] for e in inbox.messages() if e.id == mid]
    return found[0] if found else None


def test_a_message_handed_over_again_after_a_takeover_is_flagged(cluster: Cluster) -> None:
    frozen = freeze_after_read(cluster, "relay_before_ack")
    old, planner, saved = frozen.old, frozen.planner, frozen.in_flight
    wait_for(lambda: _flags(old, "worker", saved.id) is not None, 30, "the first delivery")
    assert _flags(old, "worker", saved.id) == []  # nothing to say the first time

    new = cluster.host("B", dirname="B2", lease_s=3)
    worker = new.listen("worker")
    wait_for(lambda: _flags(new, "worker", saved.id) is not None, 60, "the second delivery")
    assert POSSIBLE_REPEAT in (_flags(new, "worker", saved.id) or [])
    shown = worker.next_message()
    assert shown["id"] == saved.id and POSSIBLE_REPEAT in shown["flags"], shown
    assert "possible_repeat" in new.relay_log()

    after = planner.send("worker@B", "after the takeover")
    assert after.outcome.value == "delivered", after
    assert _flags(new, "worker", after.id) == []

    frozen.relay.send_signal(signal.SIGCONT)  # it finds itself fenced and exits
    assert frozen.relay.wait(30) != 0
