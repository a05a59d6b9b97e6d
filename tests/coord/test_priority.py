"""Priority across two hosts on both backends: carried in the message, shown in the terminal
and framed surfaces, the `urgent` wake policy, urgent mail first in a backlog."""

from __future__ import annotations

import json
from pathlib import Path

from crossintercom.agents.handover.framing import render_block
from tests.agents.conftest import finish, hook, waiting
from tests.agents.test_policy import still_running, unseen_count
from tests.relay.conftest import Cluster, wait_for


def test_urgent_wakes_an_urgent_only_session_across_hosts(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    assert b.cli_json("set-wake", "--as", "worker", "urgent")["wake"] == "urgent"
    a.listen("planner")
    proc = hook(b.env, None, "--as", "worker", "--format", "json", "--timeout", "120")
    try:
        waiting(proc, Path(b.env["CROSSINTERCOM_HOME"]))
        a.wait_sees("worker", "B")
        listed = [s for s in a.cli_json("list") if s["name"] == "worker"]
        assert listed[0]["wake"] == "urgent"  # the policy is published across hosts
        low = a.cli_json("send", "--as", "planner", "--to", "worker", "--priority", "low", "fyi")
        normal = a.cli_json("send", "--as", "planner", "--to", "worker", "the build is green")
        assert (low["outcome"], normal["outcome"]) == ("delivered", "delivered")
        wait_for(lambda: unseen_count(b.env, "worker") == 2, 30, "both messages saved on B")
        assert still_running(proc, 2.0), "mail that is not urgent woke an 'urgent' waiter"
        urgent = a.cli_json(
            "send", "--as", "planner", "--to", "worker", "--priority", "urgent", "prod is down"
        )
        assert urgent["outcome"] == "delivered"
        rc, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err
    shown = json.loads(out)
    # Woken, everything unseen is shown: most urgent first.
    assert [m["id"] for m in shown] == [urgent["id"], normal["id"], low["id"]]
    assert [m["priority"] for m in shown] == ["urgent", "normal", "low"]
    framed = render_block(shown[0], "worker")
    assert "priority=urgent" in framed.splitlines()[0]
    assert "priority=" not in render_block(shown[1], "worker").splitlines()[0]


def test_priority_in_terminal_output_and_backlog_order(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    b.cli_json("set-wake", "--as", "worker", "never")
    # A waiter that is never woken holds the session: mail is saved, unseen.
    proc = hook(b.env, None, "--as", "worker", "--format", "json", "--timeout", "120")
    try:
        waiting(proc, Path(b.env["CROSSINTERCOM_HOME"]))
        a.wait_sees("worker", "B")
        ids = [
            a.cli_json("send", "--as", "planner", "--to", "worker", "--priority", p, f"{p}")["id"]
            for p in ("normal", "high", "urgent", "low")
        ]
        wait_for(lambda: unseen_count(b.env, "worker") == 4, 30, "the backlog saved on B")
    finally:
        proc.kill()
        proc.communicate()
    backlog = b.cli_json("inbox", "--as", "worker", "--unseen")
    assert [m["id"] for m in backlog] == [ids[2], ids[1], ids[0], ids[3]]
    text = b.cli("inbox", "--as", "worker")  # the terminal listing, in arrival order
    assert text.returncode == 0, text.stderr
    heads = [line for line in text.stdout.splitlines() if line.startswith("--- ")]
    marked = {h.split(" id=")[1].split()[0]: h for h in heads}
    assert "priority=urgent" in marked[ids[2]] and "priority=" not in marked[ids[0]]
    bad = b.cli("send", "--as", "worker", "--to", "planner", "--priority", "now", "x")
    assert bad.returncode == 2
