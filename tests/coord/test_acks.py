"""Acknowledgement across two hosts on both backends: overdue for the sender until the
recipient acknowledges, then `acknowledged` with the note; the recipient's own list; a reply
acknowledges its ask."""

from __future__ import annotations

from typing import Any

from tests.conftest import background_cli
from tests.relay.conftest import Cluster, Host, wait_for


def sent_row(host: Host, name: str, mid: str) -> dict[str, Any] | None:
    rows = host.cli_json("acks", "--as", name, "--sent")
    return next((r for r in rows if r["id"] == mid), None)


def test_ack_required_overdue_then_acknowledged_across_hosts(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    b.listen("worker")
    a.listen("planner")
    a.wait_sees("worker", "B")
    sent = a.cli_json(
        "send", "--as", "planner", "--to", "worker", "--ack-required", "--ack-within", "1s",
        "--priority", "high", "deploy the fix",
    )  # fmt: skip
    assert sent["outcome"] == "delivered"
    wait_for(
        lambda: (r := sent_row(a, "planner", sent["id"])) is not None and r["overdue"],
        30,
        "the sender to see the message overdue",
    )
    mine = b.cli_json("acks", "--as", "worker")
    assert [(r["id"], r["overdue"]) for r in mine] == [(sent["id"], True)]
    assert mine[0]["from"]["host"] == "A"
    text = b.cli("acks", "--as", "worker")
    assert "OVERDUE" in text.stdout and sent["id"] in text.stdout

    done = b.cli_json("ack", "--as", "worker", "--note", "done, no reply needed", sent["id"])
    assert done == {"acknowledged": [sent["id"]]}
    assert b.cli_json("acks", "--as", "worker") == []
    row = wait_for(
        lambda: (r := sent_row(a, "planner", sent["id"])) is not None and r["acknowledged"] and r,
        30,
        "the acknowledgement to reach the sender's host",
    )
    assert row["overdue"] is False
    assert row["acknowledged_by"].startswith(b.session_id("worker"))
    assert row["note"] in (None, "done, no reply needed")  # the note crosses only on one host
    missing = b.cli("ack", "--as", "worker", "--json", "no-such-id")
    assert missing.returncode == 2


def test_a_reply_acknowledges_its_ask(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    worker = b.listen("worker")
    a.listen("planner")
    a.wait_sees("worker", "B")
    with background_cli(
        a.env, "ask", "--as", "planner", "--to", "worker", "--ack-required", "--json",
        "--timeout", "60", "ready?",
    ) as ask:  # fmt: skip
        question = worker.next_message()
        assert question["ack_required"] is True
        assert b.cli_json("reply", "--as", "worker", "yes")["outcome"] == "delivered"
        ask.communicate(timeout=60)
    assert b.cli_json("acks", "--as", "worker") == []
    wait_for(
        lambda: (r := sent_row(a, "planner", question["id"])) is not None and r["acknowledged"],
        30,
        "the reply's acknowledgement to reach the asker's host",
    )


def test_ack_on_one_host_carries_the_note(cluster: Cluster) -> None:
    (a,) = cluster.up("A")
    a.listen("worker")
    a.listen("planner")
    sent = a.cli_json("send", "--as", "planner", "--to", "worker", "--ack-required", "check")
    a.cli_json("ack", "--as", "worker", "--note", "checked", sent["id"])
    row = wait_for(
        lambda: (r := sent_row(a, "planner", sent["id"])) is not None and r["acknowledged"] and r,
        30,
        "the acknowledgement",
    )
    assert row["note"] == "checked"
