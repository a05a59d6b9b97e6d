"""The ``traffic`` frame over the broker's real socket (docs/protocol.md, docs/web.md): what
this host's sessions sent, received and had refused, with receipts as they arrive (``queued``
turning ``delivered`` when a durable session comes back, ``shown``), an ask's wait from its
``send`` frame, names as the broker knew them, paged by ``after``; and a log bounded in memory
however much passes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from crossintercom.local_broker.delivery.traffic import Traffic
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import Message, Outcome, Peer, Receipt
from tests.conftest import RawConn, cli_json, make_env, start_broker

HOSTILE = "<script>x</script>\u202e\ufeff"


def _events(home: Path, after: int = 0, limit: int = 1000) -> dict[str, Any]:
    with RawConn(home) as c:
        c.register(str(uuid.uuid4()), name=f"reader-{uuid.uuid4().hex[:6]}")
        return c.request({"type": "traffic", "after": after, "limit": limit})


def _outcomes(log: dict[str, Any], mid: str) -> list[tuple[str | None, str]]:
    return [
        (r.get("name"), r["outcome"])
        for e in log["events"]
        if e["id"] == mid
        for r in e.get("receipts", [])
    ]


def test_traffic_shows_sends_refusals_and_later_receipts(runtime_home: Path) -> None:
    env = make_env(runtime_home)
    start_broker(env)
    bob = str(uuid.uuid4())
    with RawConn(runtime_home) as c:
        c.register(bob, name="bob", durable=True)
    # bob is offline now: queued, then delivered once he is back.
    sent = cli_json(env, "send", "--as", "carol", "--to", "bob", "--subject", "s", HOSTILE)
    assert sent["outcome"] == "queued"
    refused = cli_json(env, "send", "--as", "carol", "--to", "nobody", "lost", expect_rc=3)["error"]
    log = _events(runtime_home)
    assert log["type"] == "traffic" and log["first"] >= 1
    [event] = [e for e in log["events"] if e["id"] == sent["id"] and "message" in e]
    assert event["message"]["message"] == HOSTILE
    assert event["message"]["from"]["name"] == "carol"
    assert _outcomes(log, sent["id"]) == [("bob", "queued")]
    [ref] = [e for e in log["events"] if e["id"] == refused["id"]]
    assert ref["message"]["to"] == "nobody"
    assert ref["receipts"][0]["outcome"] == "refused"
    assert ref["receipts"][0]["code"] == refused["code"]

    with RawConn(runtime_home) as c:
        c.register(bob, name="bob", durable=True)
        got = c.recv_type("deliver")
        assert got["message"]["id"] == sent["id"]
        c.send({"type": "ack", "id": sent["id"]})
        c.send(
            {"type": "shown", "messages": [{"id": sent["id"], "sender": got["message"]["from"]}]}
        )
        assert c.request({"type": "ping"})["type"] == "pong"
    later = _events(runtime_home, after=log["last"])
    assert all(e["seq"] > log["last"] for e in later["events"])
    assert ("bob", "delivered") in _outcomes(later, sent["id"])
    assert ("bob", "shown") in _outcomes(later, sent["id"])


def test_the_traffic_log_is_bounded_by_count_and_by_text(tmp_path: Path) -> None:
    state = BrokerState(tmp_path)
    try:
        log = Traffic(Registry("H", state), keep=50, keep_chars=300_000)
        sender = Peer("s1", "carol", "H")
        for n in range(200):
            msg = Message(f"m{n}", sender, to="bob", text="x" * 100)
            log.message(msg, [Receipt(msg.id, Outcome.DELIVERED, "b1", host="H")])
        read = log.read(1, 0, 1000)
        assert len(read.events) == 50 and read.last == 200 and read.first == 151
        assert [e.seq for e in log.read(2, 190, 1000).events] == list(range(191, 201))
        for n in range(5):
            log.message(Message(f"big{n}", sender, to="bob", text="y" * 100_000), [])
        assert len(log.read(3, 0, 1000).events) < 5  # the text bound dropped the oldest
    finally:
        state.close()


def test_a_bad_traffic_request_is_refused(runtime_home: Path) -> None:
    start_broker(make_env(runtime_home))
    with RawConn(runtime_home) as c:
        c.send({"type": "traffic", "request_id": 1})
        assert c.recv_type("error")["code"] == "not_registered"
        c.register(str(uuid.uuid4()), name="x")
        c.send({"type": "traffic", "request_id": 7, "limit": 0})
        assert c.recv_type("error")["code"] == "bad_field"
        assert c.request({"type": "ping"})["type"] == "pong"


def test_an_asks_wait_from_its_send_frame_reaches_the_traffic_log(runtime_home: Path) -> None:
    """``wait_s`` (docs/protocol.md, "send") is kept with the ask's event only: a plain send
    carries none, and an ask without it (an older client) is answered as before."""
    env = make_env(runtime_home)
    start_broker(env)
    with RawConn(runtime_home) as bob:
        bob.register(str(uuid.uuid4()), name="bob", durable=True)  # offline after: queued
    ids = {}
    with RawConn(runtime_home) as carol:
        carol.register(str(uuid.uuid4()), name="carol")
        for kind, extra, expects in (
            ("ask", {"wait_s": 90.0}, True),
            ("old", {}, True),
            ("send", {"wait_s": 90.0}, False),
        ):
            mid = ids[kind] = str(uuid.uuid4())
            body = {"id": mid, "to": "bob", "message": kind, "expects_reply": expects}
            answer = carol.request({"type": "send", "message": body, **extra})
            assert answer["outcome"] == "queued", answer
    log = _events(runtime_home)
    waits = {e["id"]: e.get("wait_s") for e in log["events"] if "message" in e}
    assert waits[ids["ask"]] == 90.0
    assert waits[ids["old"]] is None
    assert waits[ids["send"]] is None
