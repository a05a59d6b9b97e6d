"""The wire protocol (docs/protocol.md) against a live broker over its real Unix socket."""

from __future__ import annotations

import json
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossintercom import protocol as p
from tests.conftest import RawConn, broker_pid, make_env, pid_alive, start_broker


@pytest.fixture
def home(runtime_home: Path) -> Iterator[Path]:
    start_broker(make_env(runtime_home))
    yield runtime_home


def sid() -> str:
    return str(uuid.uuid4())


def assert_send_still_works(home: Path) -> None:
    """Two fresh live sessions exchange a message: the broker still serves everyone."""
    name_a, name_b = f"a{uuid.uuid4().hex[:8]}", f"b{uuid.uuid4().hex[:8]}"
    with RawConn(home) as a, RawConn(home) as b:
        assert a.register(sid(), name=name_a)["type"] == "registered"
        assert b.register(sid(), name=name_b)["type"] == "registered"
        mid = sid()
        a.send(
            {
                "type": "send",
                "request_id": 1,
                "message": {"id": mid, "to": name_b, "message": "still alive?"},
            }
        )
        deliver = b.recv_type("deliver")
        assert deliver["message"]["id"] == mid
        assert deliver["message"]["message"] == "still alive?"
        b.send({"type": "ack", "id": mid})
        result = a.recv_type("result")
        assert result == {"type": "result", "request_id": 1, "id": mid, "outcome": "delivered"}


# --- every frame type answered by a live broker -------------------------------------------------


def test_anonymous_queries_need_no_registration(home: Path) -> None:
    with RawConn(home) as c:
        pong = c.request({"type": "ping"})
        assert pong["type"] == "pong"
        assert pong["host"] == "testhost"
        assert pong["pid"] == broker_pid(home)
        assert c.request({"type": "list"})["sessions"] == []
        st = c.request({"type": "status"})
        assert st["type"] == "status"
        assert st["host_id"] == "testhost"
        assert st["sessions"] == 0
        assert c.request({"type": "groups"}) == {
            "type": "groups",
            "request_id": c._rid,
            "groups": [],
        }
        c.send({"type": "confirm", "ids": ["nothing"]})  # accepted silently
        assert c.request({"type": "ping"})["type"] == "pong"


def test_session_frames_answered_after_register(home: Path) -> None:
    me = sid()
    with RawConn(home) as c:
        reg = c.register(me, name="solo", status="idle", groups=["g1"], durable=True)
        assert reg["type"] == "registered"
        assert reg["attached"] is False
        assert reg["session"]["id"] == me
        assert reg["session"]["groups"] == ["g1"]
        assert c.request({"type": "join", "group": "g2"})["groups"] == ["g1", "g2"]
        assert c.request({"type": "leave", "group": "g1"})["groups"] == ["g2"]
        assert c.request({"type": "set_status", "status": "busy"})["type"] == "ok"
        assert c.request({"type": "pending"}) == {
            "type": "pending",
            "request_id": c._rid,
            "messages": [],
        }
        listed = c.request({"type": "list"})["sessions"]
        assert [(s["id"], s["status"], s["groups"]) for s in listed] == [(me, "busy", ["g2"])]
        # The relay's frames are refused from an agent session.
        for frame in (
            {"type": "remote_roster", "sessions": []},
            {"type": "inbound", "message": {}, "recipient": me},
        ):
            err = c.request(frame)
            assert (err["type"], err["code"]) == ("error", "not_relay")
        mid = sid()
        res = c.request({"type": "send", "message": {"id": mid, "to": "nobody", "message": "x"}})
        assert (res["type"], res["id"], res["outcome"], res["code"]) == (
            "result",
            mid,
            "refused",
            "not_found",
        )
        res = c.request({"type": "reply", "message": {"id": sid(), "message": "x"}})
        assert (res["outcome"], res["code"]) == ("refused", "reply_not_authorised")
    assert_send_still_works(home)


# --- each class of bad frame --------------------------------------------------------------------


def test_truncated_frame_closes_only_that_connection(home: Path) -> None:
    with RawConn(home) as bystander, RawConn(home) as c:
        bystander.register(sid(), name="bystander")
        c.send_bytes(struct.pack(">I", 100) + b'{"type": "pi')
        c.sock.shutdown(socket.SHUT_WR)
        assert c.recv() is None  # closed, no answer: the stream cannot be resynchronised
        assert bystander.request({"type": "ping"})["type"] == "pong"
    with RawConn(home) as c:  # a half header, too
        c.send_bytes(b"\x00\x00")
        c.sock.shutdown(socket.SHUT_WR)
        assert c.recv() is None
    assert_send_still_works(home)


def test_oversize_frame_refused_before_reading_it(home: Path) -> None:
    with RawConn(home) as c:
        c.send_bytes(struct.pack(">I", p.DEFAULT_MAX_FRAME + 1))
        err = c.recv()
        assert err is not None
        assert (err["type"], err["code"]) == ("error", "frame_too_large")
        assert str(p.DEFAULT_MAX_FRAME) in err["message"]
        assert c.recv() is None
    assert pid_alive(broker_pid(home) or -1)
    assert_send_still_works(home)


BAD_BODIES = [
    (b"\xff\xfe{}", "bad_utf8", None),
    (b'{"type": "ping", "request_id": ', "bad_json", None),
    (b"[1, 2, 3]", "not_object", None),
    (b'"ping"', "not_object", None),
    (b'{"type": "teleport", "request_id": 41}', "unknown_type", 41),
    (b'{"request_id": 42}', "missing_field", 42),
    (b'{"type": "send", "request_id": 43}', "missing_field", 43),
    (b'{"type": "ping", "request_id": "44"}', "bad_field", None),
    (b'{"type": "join", "request_id": 45, "group": "no spaces"}', "bad_field", 45),
    (b'{"type": "ping", "request_id": -1}', "bad_field", -1),
    (
        b'{"type": "send", "request_id": 46, "message": {"id": "m", "message": "x", "to": "a"}}',
        "not_registered",
        46,
    ),
    (b'{"type": "join", "request_id": 47, "group": "g"}', "not_registered", 47),
    (b'{"type": "ack", "id": "m"}', "not_registered", None),
    (
        b'{"type": "register", "request_id": 48, "protocol": 99, "session": {"id": "s"}}',
        "protocol_mismatch",
        48,
    ),
    (
        b'{"type": "register", "request_id": 49, "protocol": 1,'
        b' "session": {"id": "s", "purpose": "robot"}}',
        "invalid_purpose",
        49,
    ),
]


@pytest.mark.parametrize(("body", "code", "request_id"), BAD_BODIES, ids=[b[1] for b in BAD_BODIES])
def test_bad_frame_gets_stable_error_and_connection_survives(
    home: Path, body: bytes, code: str, request_id: int | None
) -> None:
    with RawConn(home) as c:
        c.send_body(body)
        err = c.recv()
        assert err is not None
        assert err["type"] == "error"
        assert err["code"] == code
        assert isinstance(err["message"], str)
        assert err["message"]
        assert err.get("request_id") == request_id
        # The stream is intact: the same connection keeps working.
        assert c.request({"type": "ping"})["type"] == "pong"
    assert_send_still_works(home)


def test_register_errors(home: Path) -> None:
    me = sid()
    with RawConn(home) as c:
        err = c.register(me, purpose="observer")
        assert (err["code"], err["request_id"]) == ("invalid_purpose", c._rid)
        assert "agent" in err["message"]
        err = c.request({"type": "register", "protocol": 2, "session": {"id": me}, "mode": "own"})
        assert err["code"] == "protocol_mismatch"
        assert "1" in err["message"]
        err = c.register(me, mode="steal")
        assert err["code"] == "bad_field"
        assert c.register(me)["type"] == "registered"
        err = c.register(me)
        assert err["code"] == "already_registered"
    assert_send_still_works(home)


def test_ack_for_nothing_is_unexpected(home: Path) -> None:
    with RawConn(home) as c:
        c.register(sid(), name="acker")
        c.send({"type": "ack", "id": "never-delivered"})
        err = c.recv()
        assert err is not None
        assert (err["type"], err["code"]) == ("error", "unexpected_ack")
        assert "never-delivered" in err["message"]
    assert_send_still_works(home)


def test_request_id_correlates_interleaved_requests(home: Path) -> None:
    with RawConn(home) as c:
        c.send({"type": "ping", "request_id": 7})
        c.send({"type": "teleport", "request_id": 8})
        c.send({"type": "list", "request_id": 9})
        answers = {f["request_id"]: f for f in (c.recv(), c.recv(), c.recv()) if f}
        assert answers[7]["type"] == "pong"
        assert answers[8]["code"] == "unknown_type"
        assert answers[9]["type"] == "sessions"


def test_control_session_is_not_a_mailbox(home: Path) -> None:
    """A control client (the relay) gets a stable error for session frames, never 'internal'."""
    with RawConn(home) as ctl:
        assert ctl.register(sid(), purpose="control")["attached"] is False
        for frame in (
            {"type": "join", "group": "g"},
            {"type": "leave", "group": "g"},
            {"type": "pending"},
            {"type": "send", "message": {"id": sid(), "to": "x", "message": "y"}},
            {"type": "reply", "message": {"id": sid(), "message": "y"}},
        ):
            err = ctl.request(frame)
            assert (err["type"], err["code"]) == ("error", "not_agent"), (frame, err)
        assert ctl.request({"type": "set_status", "status": "store ok"})["type"] == "ok"
        # Not listed and not counted as a session.
        with RawConn(home) as c:
            assert c.request({"type": "list"})["sessions"] == []
            st = c.request({"type": "status"})
            assert st["sessions"] == 0
            assert st["relay"] == {"connected": True, "store": "store ok"}
        # A second relay is refused with its own code (not the relay process's lock code).
        with RawConn(home) as second:
            err = second.register(sid(), purpose="control")
            assert (err["type"], err["code"]) == ("error", "relay_already_connected")
    assert "Traceback" not in (home / "broker.log").read_text()
    assert_send_still_works(home)


def test_unacknowledged_delivery_is_unknown_and_keeps_the_session(
    runtime_home: Path, cli_env: dict[str, str]
) -> None:
    """A recipient that takes a message but never acks: the sender hears `unknown` (it may
    have been saved), and the recipient is not thrown off as if its socket had failed."""
    (runtime_home / "config.json").write_text(json.dumps({"ack_timeout_s": 0.3}))
    start_broker(cli_env)
    sid = "5a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    with RawConn(runtime_home) as mute, RawConn(runtime_home) as sender:
        assert (
            mute.request(
                {"type": "register", "protocol": 1, "session": {"id": sid, "name": "mute"}}
            )["type"]
            == "registered"
        )
        assert (
            sender.request(
                {"type": "register", "protocol": 1, "session": {"id": str(uuid.uuid4())}}
            )["type"]
            == "registered"
        )
        for _ in range(2):
            mid = str(uuid.uuid4())
            result = sender.request(
                {"type": "send", "message": {"id": mid, "to": "mute", "message": "hi"}}
            )
            assert (result["outcome"], result["code"]) == ("unknown", "no_ack")
            assert mute.recv_type("deliver")["message"]["id"] == mid
        listed = sender.request({"type": "list"})["sessions"]
        assert [s["online"] for s in listed if s["id"] == sid] == [True]


def test_receipt_pushed_to_a_sender_that_dies_before_acking_comes_back(
    runtime_home: Path, cli_env: dict[str, str]
) -> None:
    """An `expired` receipt shown live to a durable sender whose connection dies before it
    acknowledges stays queued, and is handed over again when the sender returns."""
    (runtime_home / "config.json").write_text(
        json.dumps({"retention_s": 0.5, "sweep_interval_s": 0.2})
    )
    start_broker(cli_env)
    alice = {"id": str(uuid.uuid4()), "name": "alice", "durable": True}
    bob = {"id": str(uuid.uuid4()), "name": "bob", "durable": True}
    with RawConn(runtime_home) as b:
        b.request({"type": "register", "protocol": 1, "session": bob})
    with RawConn(runtime_home) as a:
        a.request({"type": "register", "protocol": 1, "session": alice})
        mid = str(uuid.uuid4())
        sent = a.request({"type": "send", "message": {"id": mid, "to": "bob", "message": "x"}})
        assert sent["outcome"] == "queued"
        notice = a.recv_type("notice")  # the expiry receipt, live; never acknowledged
        assert (notice["receipt"]["id"], notice["receipt"]["outcome"]) == (mid, "expired")
    with RawConn(runtime_home) as again:
        again.request({"type": "register", "protocol": 1, "session": alice})
        resent = again.recv_type("notice")
        assert resent["receipt"]["id"] == mid
        again.send({"type": "ack", "id": resent["key"]})
    with RawConn(runtime_home) as third:  # acknowledged now: not handed over a third time
        third.request({"type": "register", "protocol": 1, "session": alice})
        third.sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            third.recv()
