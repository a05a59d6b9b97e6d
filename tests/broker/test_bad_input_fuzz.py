"""Random bytes and random frames at a live broker (hypothesis): every answer is a well-formed
frame with a known code, the broker never exits, and a normal send between live sessions still
works afterwards. The other bad inputs, one by one: test_bad_input.py."""

from __future__ import annotations

import json
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossintercom import protocol as p
from tests.conftest import RawConn, broker_pid, make_env, pid_alive, start_broker
from tests.protocol.test_wire import assert_send_still_works

KNOWN_CODES = {
    "bad_utf8",
    "bad_json",
    "not_object",
    "unknown_type",
    "missing_field",
    "bad_field",
    "not_registered",
    "protocol_mismatch",
    "invalid_purpose",
    "already_registered",
    "unexpected_ack",
    "frame_too_large",
    "not_relay",
    "relay_already_connected",
    "session_in_use",
    "not_agent",
    "not_found",  # `forget` of a session this host does not know
}


@pytest.fixture
def live_home(runtime_home: Path) -> Iterator[Path]:
    # One broker serves every example of a property test; a loaded machine can leave more
    # than the default idle exit (5 s) between two examples' connections.
    (runtime_home / "config.json").write_text(json.dumps({"idle_exit_s": 600}))
    start_broker(make_env(runtime_home))
    yield runtime_home


def exchange(home: Path, data: bytes) -> list[dict[str, Any]]:
    """Write ``data`` on a fresh connection, half-close, and collect every answer frame."""
    frames: list[dict[str, Any]] = []
    with RawConn(home, timeout=10) as c:
        c.send_bytes(data)
        c.sock.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := c.sock.recv(65536):
            buf += chunk
    while len(buf) >= 4:
        (n,) = struct.unpack(">I", buf[:4])
        assert len(buf) >= 4 + n, "the broker wrote a truncated frame"
        frames.append(json.loads(buf[4 : 4 + n]))
        buf = buf[4 + n :]
    assert buf == b""
    return frames


def check_answers(frames: list[dict[str, Any]]) -> None:
    for f in frames:
        assert isinstance(f.get("type"), str), f
        if f["type"] == "error":
            assert f["code"] in KNOWN_CODES, f  # never "internal": no unhandled exception
            assert isinstance(f["message"], str)
        if f["type"] == "result":
            assert f.get("code") != "internal", f


json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "request_id",
    "protocol",
    "session",
    "mode",
    "message",
    "id",
    "ids",
    "group",
    "status",
    "refused",
    "sessions",
    "recipient",
    "fid",
    "receipts",
]


@st.composite
def frame_bodies(draw: st.DrawFn) -> bytes:
    frame: dict[str, Any] = {"type": draw(st.sampled_from([*sorted(p.CLIENT_TYPES), "nope"]))}
    if draw(st.booleans()):
        frame["request_id"] = draw(st.integers(min_value=0, max_value=2**31))
    if frame["type"] == "register" and draw(st.booleans()):
        frame["protocol"] = draw(st.sampled_from([1, 1, 2]))
        frame["session"] = {
            "id": str(uuid.uuid4()),
            "purpose": draw(st.sampled_from(["agent", "control", "spy"])),
            "durable": draw(st.booleans()),
        }
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=4)):
        frame.setdefault(key, draw(json_value))
    if frame["type"] in ("send", "reply") and draw(st.booleans()):
        frame["message"] = {
            "id": str(uuid.uuid4()),
            "message": draw(st.text(max_size=20)),
            "to": draw(st.sampled_from(["nobody", "group:default", str(uuid.uuid4())])),
            "expects_reply": draw(st.booleans()),
        }
    return json.dumps(frame).encode()


def framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.binary(max_size=300))
def test_random_bytes_never_hurt_the_broker(live_home: Path, data: bytes) -> None:
    check_answers(exchange(live_home, data))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(bodies=st.lists(frame_bodies() | st.binary(max_size=40), min_size=1, max_size=6))
def test_random_frames_never_hurt_the_broker(live_home: Path, bodies: list[bytes]) -> None:
    check_answers(exchange(live_home, b"".join(framed(b) for b in bodies)))


def test_broker_survives_garbage_then_delivers(live_home: Path) -> None:
    pid = broker_pid(live_home)
    exchange(live_home, b"\xff" * 64)
    exchange(live_home, framed(b"[]") + framed(b"\x80") + struct.pack(">I", 10**9))
    with RawConn(live_home) as c:
        c.send_bytes(struct.pack(">I", 50) + b"{")  # left half-written while others go on
        assert_send_still_works(live_home)
    assert broker_pid(live_home) == pid
    assert pid is not None
    assert pid_alive(pid)
    assert_send_still_works(live_home)
