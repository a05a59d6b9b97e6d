"""Two and three simulated hosts over one store: the CLI and the Python API across machines."""

from __future__ import annotations

import contextlib
import json
import time
import uuid

from crossintercom.client import Client
from crossintercom.models import Receipt
from tests.conftest import MESSAGE_KEYS, background_cli
from tests.relay.conftest import Cluster, wait_for


def test_send_ask_reply_list_across_two_hosts(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    worker = b.listen("worker")
    planner = a.listen("planner")
    a.wait_sees("worker", "B")
    b.wait_sees("planner", "A")

    # send: delivered, and the listener on B prints the message object of docs/protocol.md
    sent = a.cli_json("send", "--as", "planner", "--to", "worker", "hello from A")
    assert set(sent) >= {"id", "outcome"}
    assert sent["outcome"] == "delivered"
    got = worker.next_message()
    assert set(got) == MESSAGE_KEYS
    assert got["id"] == sent["id"]
    assert got["message"] == "hello from A"
    assert got["from"]["name"] == "planner"
    assert got["from"]["host"] == "A"
    assert got["from"]["id"] == a.session_id("planner")
    assert got["expects_reply"] is False
    assert got["reply_to"] is None
    assert got["attachments"] == []

    # ask on A, reply on B: the ask prints the reply
    with background_cli(
        a.env, "ask", "--as", "planner", "--to", "worker", "--timeout", "60", "--json", "ok?"
    ) as ask:
        question = worker.next_message()
        assert question["expects_reply"] is True
        assert question["message"] == "ok?"
        pending = b.cli_json("pending", "--as", "worker")
        assert [m["id"] for m in pending] == [question["id"]]
        replied = b.cli_json("reply", "--as", "worker", "yes, all green")
        assert replied["outcome"] == "delivered"
        out, err = ask.communicate(timeout=60)
    assert ask.returncode == 0, (out, err)
    answer = json.loads(out)
    assert answer["id"] == question["id"]
    assert answer["outcome"] == "delivered"
    assert answer["reply"]["message"] == "yes, all green"
    assert answer["reply"]["reply_to"] == question["id"]
    assert answer["reply"]["from"]["host"] == "B"
    assert set(answer["reply"]) == MESSAGE_KEYS
    # a second reply to the same ask is refused (the first consumed the pending entry)
    again = b.cli("reply", "--as", "worker", "--reply-to", question["id"], "--json", "again")
    assert again.returncode == 3, (again.stdout, again.stderr)
    assert json.loads(again.stdout)["error"]["code"] in ("already_replied", "reply_not_authorised")

    # list on either host shows both sessions with their hosts, online
    for host in (a, b):
        listed = host.cli_json("list")
        by_name = {(s["name"], s["host"]): s for s in listed}
        assert by_name[("worker", "B")]["online"] is True
        assert by_name[("planner", "A")]["online"] is True
        assert by_name[("worker", "B")]["id"] == b.session_id("worker")
        assert by_name[("planner", "A")]["id"] == a.session_id("planner")
        assert all(s["purpose"] == "agent" for s in listed)  # relays are not listed
    assert planner.proc.poll() is None


def test_three_hosts_groups_names_and_dedup(cluster: Cluster) -> None:
    a, b, c = cluster.up("A", "B", "C")
    planner = a.client("planner")
    dup_a = a.client("dup", groups=("team",))
    dup_b = b.client("dup")
    worker_b = b.client("worker", groups=("team",))
    worker_c = c.client("worker", groups=("team",))
    for name, host in (("dup", "B"), ("worker", "B"), ("worker", "C")):
        a.wait_sees(name, host)
    c.wait_sees("planner", "A")

    # group:team spans three hosts: one receipt per member, each delivered
    res = planner.send("group:team", "stand-up in 5")
    assert res.outcome.value == "delivered", res
    assert res.receipts is not None
    assert sorted(r.recipient or "" for r in res.receipts) == sorted(
        [a.session_id("dup"), b.session_id("worker"), c.session_id("worker")]
    )
    assert all(r.outcome.value == "delivered" for r in res.receipts), res.receipts
    for member in (dup_a, worker_b, worker_c):
        inc = member.next_incoming(20)
        assert inc is not None and inc.message is not None
        assert inc.message.id == res.id
    assert dup_b.next_incoming(0.3) is None  # not a member

    # the CLI shows the group result the same way
    out = a.cli_json("send", "--as", "planner", "--to", "group:team", "again")
    assert out["outcome"] == "delivered"
    assert len(out["receipts"]) == 3
    for member in (dup_a, worker_b, worker_c):
        inc = member.next_incoming(20)
        assert inc is not None and inc.message is not None and inc.message.id == out["id"]

    # a bare name prefers this host
    res = planner.send("dup", "local first")
    assert res.outcome.value == "delivered"
    inc = dup_a.next_incoming(20)
    assert inc is not None and inc.message is not None and inc.message.id == res.id
    assert dup_b.next_incoming(0.3) is None
    # ... also when the other copies are remote: "worker" from B is worker@B, not worker@C
    res = dup_b.send("worker", "B to its own worker")
    assert res.outcome.value == "delivered", res
    inc = worker_b.next_incoming(20)
    assert inc is not None and inc.message is not None and inc.message.id == res.id
    assert worker_c.next_incoming(0.3) is None
    # ... and from C, which has no "dup", two remote "dup"s are ambiguous
    res = worker_c.send("dup", "from C")
    assert res.outcome.value == "refused", res
    assert res.code == "ambiguous"
    assert res.message is not None and "dup@A" in res.message and "dup@B" in res.message
    assert dup_a.next_incoming(0.3) is None
    assert dup_b.next_incoming(0.3) is None

    # ambiguity across hosts is refused with NAME@HOSTID candidates; nothing is delivered
    amb = a.cli("send", "--as", "planner", "--to", "worker", "--json", "which one?")
    assert amb.returncode == 3, (amb.stdout, amb.stderr)
    err = json.loads(amb.stdout)["error"]
    assert err["code"] == "ambiguous"
    assert "worker@B" in err["message"] and "worker@C" in err["message"]
    # NAME@HOSTID picks one
    out = a.cli_json("send", "--as", "planner", "--to", "worker@C", "you, C")
    assert out["outcome"] == "delivered"
    inc = worker_c.next_incoming(20)
    assert inc is not None and inc.message is not None and inc.message.id == out["id"]
    assert worker_b.next_incoming(0.3) is None

    # the same message id sent twice is delivered once (the store is the dedup authority)
    mid = str(uuid.uuid4())
    first = planner.send("worker@B", "exactly once", message_id=mid)
    second = planner.send("worker@B", "exactly once", message_id=mid)
    assert first.id == second.id == mid
    assert first.outcome.value == "delivered"
    assert second.outcome.value in ("delivered", "queued"), second
    inc = worker_b.next_incoming(20)
    assert inc is not None and inc.message is not None and inc.message.id == mid
    assert worker_b.next_incoming(1.0) is None
    assert b.inbox("worker")[mid] == 1
    # the same id with another text is refused, never delivered
    conflict = planner.send("worker@B", "something else", message_id=mid)
    assert conflict.outcome.value == "refused", conflict
    assert conflict.code == "payload_conflict"
    assert worker_b.next_incoming(0.5) is None


def test_offline_recipient_gets_queued_message_once_on_return(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    assert worker.stop() == 0
    a.wait_sees("worker", "B", online=False)

    sent = a.cli_json("send", "--as", "planner", "--to", "worker", "while you were away")
    assert sent["outcome"] == "queued"

    back = b.listen("worker")
    got = back.next_message()
    assert got["id"] == sent["id"]
    assert "resumed" in got["flags"]
    # once: nothing else comes, and the inbox holds it once
    time.sleep(1.0)
    assert back.message_ids() == {sent["id"]: 1}
    assert b.inbox("worker")[sent["id"]] == 1
    a.wait_sees("worker", "B", online=True)


def test_no_relay_remote_target_not_sent_local_still_works(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    b.listen("worker")
    a.wait_sees("worker", "B")
    a.stop_relay()
    wait_for(lambda: not a.relay_connected(), 20, "A's broker to notice its relay is gone")
    local = a.listen("helper")

    # a hang would hit the subprocess timeout
    out = a.cli("send", "--as", "planner", "--to", "worker@B", "--json", "anyone?", timeout=30)
    assert out.returncode == 4, (out.returncode, out.stdout, out.stderr)
    err = json.loads(out.stdout)["error"]
    assert err["outcome"] == "not_sent"
    assert err["code"] == "no_relay"

    # local sends still work
    res = a.cli_json("send", "--as", "planner", "--to", "helper", "local is fine")
    assert res["outcome"] == "delivered"
    assert local.next_message()["id"] == res["id"]


def test_burst_of_registrations_published_without_conflicts(cluster: Cluster) -> None:
    """Sessions coming and going in a burst: the relay publishes the roster one write at a time
    (concurrent publishes of one host's roster collided in the store and had to wait for the
    next heartbeat), and the other host ends up with exactly the live set."""
    a, b = cluster.up("A", "B")
    names = [f"w{i}" for i in range(8)]
    clients = {n: b.client(n) for n in names}
    for n in names[:3]:
        clients[n].close()
    for n in names[3:]:
        a.wait_sees(n, "B", online=True)
    for n in names[:3]:
        a.wait_sees(n, "B", online=False)
    assert "roster publish failed" not in b.relay_log(), b.relay_log()[-3000:]


def test_row_that_cannot_be_handed_over_is_refused_not_retried_forever(cluster: Cluster) -> None:
    """B's recipient takes its messages but never acknowledges them: the row is tried a few
    times, then marked refused (`undeliverable`) and the sender's host gets that receipt."""
    from tests.conftest import RawConn

    a, b = cluster.up("A", "B", B={"ack_timeout_s": 0.3})
    mute = RawConn(b.home)
    try:
        sid = "0b0e6a8c-5d1e-4f7a-9c3b-2a1d0e9f8c7b"
        reg = mute.request(
            {"type": "register", "protocol": 1, "session": {"id": sid, "name": "mute"}}
        )
        assert reg["type"] == "registered"
        a.wait_sees("mute", "B")
        planner: Client = a.client("planner")
        first = planner.send("mute@B", "hello?")
        assert first.outcome.value == "queued"  # committed; no receipt within remote_ack_wait

        def refused_receipt() -> Receipt | None:
            item = planner.next_incoming(timeout=1)
            if item is not None and item.receipt is not None and item.receipt.id == first.id:
                return item.receipt
            return None

        receipt = wait_for(
            refused_receipt,
            60,
            lambda: (
                "the undeliverable receipt on A; B relay log:\n"
                + b.relay_log()[-3000:]
                + "\nA relay log:\n"
                + a.relay_log()[-2000:]
                + "\nB broker log:\n"
                + (b.home / "broker.log").read_text()[-2000:]
            ),
        )
        assert (receipt.outcome, receipt.code) == ("refused", "undeliverable")
        delivered_to_mute = 0
        mute.sock.settimeout(0.2)
        with contextlib.suppress(TimeoutError):
            while (frame := mute.recv()) is not None:
                delivered_to_mute += frame["type"] == "deliver"
        assert delivered_to_mute >= 1  # handed over (and never acknowledged) before giving up
    finally:
        mute.close()
