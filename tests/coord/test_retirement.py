"""Name retirement across two hosts on both backends: a durable name idle past its
retirement age is retired as `forget` would, its queued mail expiring with receipts to its
senders (and so listed in their dead letters); a name in use is never retired."""

from __future__ import annotations

from tests.relay.conftest import Cluster, wait_for


def test_an_idle_name_is_retired_with_receipts(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", B={"retire_idle_s": 8, "sweep_interval_s": 0.5})
    a.listen("planner")
    busy = b.listen("busy")  # held all along: never idle
    b.cli("wait", "--as", "worker", "--timeout", "0")  # known on B, then away
    a.wait_sees("worker", "B", online=False)
    queued = a.cli_json("send", "--as", "planner", "--to", "worker", "for later")
    assert queued["outcome"] == "queued"

    rows = wait_for(lambda: a.cli_json("dead-letters", "--as", "planner"), 60, "the retirement")
    assert [(r["id"], r["outcome"], r["code"]) for r in rows] == [
        (queued["id"], "expired", "forgotten")
    ]
    wait_for(lambda: not b.sees("worker", "B", online=False), 30, "worker to leave the roster")
    assert b.sees("busy", "B")
    sent = a.cli_json("send", "--as", "planner", "--to", "busy", "still here?")
    assert sent["outcome"] == "delivered"
    assert busy.next_message()["id"] == sent["id"]
