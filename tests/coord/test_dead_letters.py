"""Dead letters across two hosts on both backends: a refusal and an expiry (the recipient
forgotten before collecting it) are listed on the sending host with their reasons, and a
resend is a new message in the old one's thread."""

from __future__ import annotations

from typing import Any

from tests.relay.conftest import Cluster, Host, wait_for


def dead(host: Host, name: str, *extra: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = host.cli_json("dead-letters", "--as", name, *extra)
    return found


def test_expired_and_refused_mail_is_listed_and_resent(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    a.listen("planner")
    b.cli("wait", "--as", "worker", "--timeout", "0")  # worker: a known session on B, away
    a.wait_sees("worker", "B", online=False)
    queued = a.cli_json(
        "send", "--as", "planner", "--to", "worker", "--subject", "report",
        "--priority", "high", "the weekly report",
    )  # fmt: skip
    assert queued["outcome"] == "queued"
    nowhere = a.cli_json("send", "--as", "planner", "--to", "nobody", "hello?", expect_rc=3)
    assert nowhere["error"]["outcome"] == "refused"
    assert dead(a, "planner")[0]["code"] == "not_found"

    wait_for(lambda: b.cli("forget", "worker").returncode == 0, 60, "worker to be forgotten")
    rows = wait_for(lambda: len(found := dead(a, "planner")) == 2 and found, 60, "the expiry")
    expired = next(r for r in rows if r["id"] == queued["id"])
    assert (expired["outcome"], expired["code"]) == ("expired", "forgotten")
    assert expired["recipient"] == b.session_id("worker")
    assert (expired["message"], expired["subject"], expired["priority"]) == (
        "the weekly report",
        "report",
        "high",
    )
    assert dead(b, "worker") == []  # kept on the sending host only
    text = a.cli("dead-letters", "--as", "planner")
    assert "forgotten" in text.stdout and "not_found" in text.stdout

    worker = b.listen("worker")  # the same durable name again
    a.wait_sees("worker", "B")
    again = a.cli_json("resend", "--as", "planner", queued["id"])
    assert again["outcome"] == "delivered" and again["id"] != queued["id"]
    got = worker.next_message()
    assert got["id"] == again["id"]
    assert (got["message"], got["thread_id"], got["priority"]) == (
        "the weekly report",
        queued["id"],
        "high",
    )
    listed = next(r for r in dead(a, "planner") if r["id"] == queued["id"])
    assert listed["resent_as"] == again["id"]
    missing = a.cli_json("resend", "--as", "planner", "no-such-id", expect_rc=3)
    assert missing["error"]["code"] == "not_found"
    twice = a.cli_json("resend", "--as", "planner", queued["id"], expect_rc=3)
    assert twice["error"]["code"] == "already_resent"
    assert f"already resent as {again['id']}" in twice["error"]["message"]
    worker.no_message()  # no second copy
    other = a.cli_json("resend", "--as", "planner", queued["id"], "--recipient", "x", expect_rc=3)
    assert "to 'x'" in other["error"]["message"]
