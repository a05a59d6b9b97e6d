"""Bad input gets a stable error code and a readable message, and loses nothing (issue 2).

The broker keeps serving every other session: most tests end by checking that a normal send
between live sessions still works.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossintercom import protocol as p
from tests.conftest import (
    CLI,
    Listener,
    RawConn,
    broker_pid,
    cli_json,
    make_env,
    pid_alive,
    run_cli,
    start_broker,
    wait_for,
)
from tests.protocol.test_wire import assert_send_still_works

ERROR_KEYS = {"code", "message", "outcome", "id"}


def error_of(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The ``--json`` error object (README.md, exit codes) a command printed."""
    doc = json.loads(out.stdout)
    assert set(doc) == {"error"}, doc
    assert set(doc["error"]) >= ERROR_KEYS, doc
    assert doc["error"]["message"]
    err: dict[str, Any] = doc["error"]
    return err


def test_reply_to_nothing_is_not_authorised(cli_env: dict[str, str]) -> None:
    out = run_cli(cli_env, "reply", "--as", "worker", "--json", "answer to nothing")
    assert out.returncode == 3, out.stderr
    err = error_of(out)
    assert (err["code"], err["outcome"]) == ("reply_not_authorised", "refused")
    assert err["id"]
    out = run_cli(cli_env, "reply", "--as", "worker", "--reply-to", "no-such-ask", "--json", "x")
    assert out.returncode == 3
    err = error_of(out)
    assert err["code"] == "reply_not_authorised"
    assert "no-such-ask" in err["message"]
    # Without --json: one readable line on stderr, same exit code.
    out = run_cli(cli_env, "reply", "--as", "worker", "x")
    assert out.returncode == 3
    assert "reply_not_authorised" in out.stderr
    assert out.stdout == ""


def test_second_reply_is_already_replied(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker") as worker:
        asker = subprocess.Popen(
            [*CLI, "ask", "--as", "planner", "--to", "worker", "--timeout", "20", "--json", "q?"],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            (ask,) = worker.messages(1)
            first = cli_json(cli_env, "reply", "--as", "worker", "--reply-to", ask["id"], "one")
            assert first["outcome"] == "delivered"
            stdout, stderr = asker.communicate(timeout=20)
        finally:
            if asker.poll() is None:
                asker.kill()
                asker.communicate()
        assert asker.returncode == 0, stderr
        assert json.loads(stdout)["reply"]["message"] == "one"
        out = run_cli(cli_env, "reply", "--as", "worker", "--reply-to", ask["id"], "--json", "two")
        assert out.returncode == 3
        err = error_of(out)
        assert (err["code"], err["outcome"]) == ("already_replied", "refused")
        # Nothing is pending any more, so a reply without --reply-to is not authorised.
        assert cli_json(cli_env, "pending", "--as", "worker") == []
        out = run_cli(cli_env, "reply", "--as", "worker", "--json", "three")
        assert error_of(out)["code"] == "reply_not_authorised"


def test_target_not_found(cli_env: dict[str, str]) -> None:
    for target in ("nobody", "nobody@testhost", str(uuid.uuid4()), "group:empty"):
        out = run_cli(cli_env, "send", "--as", "planner", "--to", target, "--json", "hello?")
        assert out.returncode == 3, (target, out.stdout, out.stderr)
        err = error_of(out)
        assert (err["code"], err["outcome"]) == ("not_found", "refused"), target
        assert err["id"]


def test_ambiguous_name_lists_candidates(cli_env: dict[str, str], runtime_home: Path) -> None:
    one, two = str(uuid.uuid4()), str(uuid.uuid4())
    with (
        Listener(cli_env, "dup", "--session-id", one) as first,
        Listener(cli_env, "dup", "--session-id", two) as second,
    ):
        wait_for(
            lambda: len([s for s in (sessions_of(runtime_home)) if s["name"] == "dup"]) == 2,
            10,
            "both dup sessions",
        )
        out = run_cli(cli_env, "send", "--as", "planner", "--to", "dup", "--json", "which?")
        assert out.returncode == 3
        err = error_of(out)
        assert (err["code"], err["outcome"]) == ("ambiguous", "refused")
        # The candidates must let the sender pick one: both ids are listed.
        assert one in err["message"]
        assert two in err["message"]
        assert "dup@testhost" in err["message"]
        first.no_message(0.2)
        second.no_message(0.0)
        # Picking one by id works.
        assert cli_json(cli_env, "send", "--to", two, "you")["outcome"] == "delivered"
        assert second.messages(1)[0]["message"] == "you"
        first.no_message(0.2)


def sessions_of(home: Path) -> list[dict[str, Any]]:
    with RawConn(home) as c:
        result: list[dict[str, Any]] = c.request({"type": "list"})["sessions"]
        return result


def test_huge_attachment_refused_before_sending(
    cli_env: dict[str, str], runtime_home: Path, tmp_path: Path
) -> None:
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(100 * 1024 * 1024)  # 100 MB, sparse: cheap to create
    with Listener(cli_env, "worker") as worker:
        out = run_cli(
            cli_env,
            "send",
            "--as",
            "planner",
            "--to",
            "worker",
            "--attach",
            str(big),
            "--json",
            "x",
        )
        assert out.returncode == 2, (out.stdout, out.stderr)
        err = error_of(out)
        assert err["code"] == "too_large"
        assert "104857600 bytes" in err["message"]
        assert "limit" in err["message"]
        out = run_cli(cli_env, "send", "--to", "worker", "--attach", str(big), "x")
        assert out.returncode == 2
        assert "104857600 bytes" in out.stderr
        worker.no_message(0.5)
        assert cli_json(cli_env, "inbox", "--as", "worker") == []
        assert cli_json(cli_env, "send", "--to", "worker", "small")["outcome"] == "delivered"
        assert worker.messages(1)[0]["message"] == "small"


def test_oversize_message_text_refused_by_broker(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker") as worker:
        out = run_cli(
            cli_env, "send", "--to", "worker", "--json", "-", input="x" * (2 * 1024 * 1024)
        )
        assert out.returncode == 3, out.stderr
        err = error_of(out)
        assert (err["code"], err["outcome"]) == ("too_large", "refused")
        worker.no_message(0.3)


def test_home_too_long_for_af_unix() -> None:
    home = Path("/tmp") / ("d" * 120)
    env = make_env(home)
    out = run_cli(env, "send", "--as", "planner", "--to", "worker", "--json", "x")
    assert out.returncode == 1
    err = error_of(out)
    assert err["code"] == "runtime_dir"
    assert "AF_UNIX" in err["message"]
    assert "CROSSINTERCOM_HOME" in err["message"]
    out = run_cli(env, "listen", "--as", "worker")
    assert out.returncode == 1
    assert "AF_UNIX" in out.stderr
    assert "Traceback" not in out.stderr
    assert not home.exists()


@pytest.mark.parametrize("name", ["two words", "tab\there", "bell\x07", "-dash", "x" * 65, ""])
def test_bad_names_are_usage_errors(cli_env: dict[str, str], name: str) -> None:
    for args in (
        ("send", "--as", name, "--to", "worker", "--json", "x"),
        ("listen", "--as", name, "--json"),
        ("inbox", "--as", name, "--json"),
    ):
        out = run_cli(cli_env, *args, timeout=15)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert error_of(out)["code"] == "invalid_argument"


def test_bad_group_name_is_refused(cli_env: dict[str, str]) -> None:
    out = run_cli(cli_env, "join", "--as", "worker", "--json", "two words")
    assert out.returncode == 2, out.stderr
    err = error_of(out)
    assert err["code"] == "invalid_argument"
    assert "two words" in err["message"]


def test_second_listen_is_session_in_use(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker") as worker:
        out = run_cli(cli_env, "listen", "--as", "worker", "--json", timeout=15)
        assert out.returncode == 1
        err = error_of(out)
        assert err["code"] == "session_in_use"
        assert "worker" in err["message"]
        out = run_cli(cli_env, "listen", "--as", "worker", timeout=15)
        assert out.returncode == 1
        assert "already live" in out.stderr
        assert cli_json(cli_env, "send", "--to", "worker", "still yours")["outcome"] == "delivered"
        assert worker.messages(1)[0]["message"] == "still yours"


def test_runtime_dir_owned_by_someone_else(runtime_home: Path) -> None:
    other = runtime_home / "other"
    other.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    if os.geteuid() == nobody.pw_uid:
        pytest.skip("running as nobody")
    os.chown(other, nobody.pw_uid, nobody.pw_gid)
    env = make_env(other)
    for args in (("send", "--to", "worker", "--json", "x"), ("listen", "--as", "w", "--json")):
        out = run_cli(env, *args)
        assert out.returncode == 1, out.stderr
        err = error_of(out)
        assert err["code"] == "runtime_dir"
        assert "owned by uid" in err["message"]
    assert list(other.iterdir()) == []  # nothing created in someone else's dir


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ("{not json", "not readable JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"idle_exit_s": "soon"}', "'idle_exit_s' must be a positive number"),
        ('{"max_frame_bytes": -1}', "'max_frame_bytes' must be a positive number"),
        ('{"colour": "blue"}', "unknown setting 'colour'"),
        ('{"host_id": 5}', "'host_id' must be a string"),
    ],
)
def test_bad_config_json(
    cli_env: dict[str, str], runtime_home: Path, config: str, fragment: str
) -> None:
    (runtime_home / "config.json").write_text(config)
    out = run_cli(cli_env, "send", "--to", "worker", "--json", "x")
    assert out.returncode == 1
    err = error_of(out)
    assert err["code"] == "invalid_config"
    assert fragment in err["message"]
    assert str(runtime_home / "config.json") in err["message"]
    out = run_cli(cli_env, "list")
    assert out.returncode == 1
    assert fragment in out.stderr
    assert "Traceback" not in out.stderr
    assert broker_pid(runtime_home) is None


@pytest.mark.parametrize("host_id", ["two words", "a/b", "tab\tid", "x" * 256])
def test_bad_host_id(runtime_home: Path, host_id: str) -> None:
    env = make_env(runtime_home, host_id=host_id)
    out = run_cli(env, "send", "--to", "worker", "--json", "x")
    assert out.returncode == 1
    err = error_of(out)
    assert err["code"] == "invalid_config"
    assert "invalid host id" in err["message"]


# --- random garbage at a live broker ------------------------------------------------------------

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
