"""A forward its relay never answers (the relay frozen, as a paused VM would be) comes back to
the sender as ``unknown`` (``relay_lost``: do not resend automatically) once the store's wait
and the broker's grace have passed; the broker's sweep of such forwards leaves the ones after
it alone, and they are answered as usual once the relay runs again."""

from __future__ import annotations

import signal

from tests.relay.conftest import Cluster


def test_a_forward_the_frozen_relay_never_answers_is_unknown(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", A={"remote_ack_wait_s": 0.5})
    b.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")
    assert planner.send("worker@B", "before").outcome.value == "delivered"
    relay = a.relay
    assert relay is not None
    relay.send_signal(signal.SIGSTOP)
    try:
        lost = planner.send("worker@B", "while the relay is frozen")
    finally:
        relay.send_signal(signal.SIGCONT)
    assert (lost.outcome.value, lost.code) == ("unknown", "relay_lost"), lost
    after = planner.send("worker@B", "after")
    assert after.outcome.value == "delivered", after
