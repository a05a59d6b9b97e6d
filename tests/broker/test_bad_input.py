"""Bad input gets a stable error code and a readable message, and loses nothing (issue 2).

The broker keeps serving every other session: most tests end by checking that a normal send
between live sessions still works.
"""

from __future__ import annotations

import json
import os
import pwd
import struct
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from crossintercom.client import Identity
from crossintercom.models import CWD_CHARS, DESCRIPTION_CHARS, MAX_GROUPS
from tests.conftest import (
    CLI,
    Listener,
    RawConn,
    broker_pid,
    cli_json,
    make_env,
    run_cli,
    settings_for,
    start_broker,
    wait_for,
)

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


def test_a_session_s_groups_are_bounded(cli_env: dict[str, str], runtime_home: Path) -> None:
    """Every `list` and `groups` answer carries every session's groups: a client that registers
    or joins without end once made those answers too large for every other client to read."""
    start_broker(cli_env)
    many = [f"g{i}" for i in range(MAX_GROUPS + 1)]
    with RawConn(runtime_home) as conn:
        refused = conn.register("s-many", name="many", groups=many)
        assert (refused["type"], refused["code"]) == ("error", "bad_field")
        assert conn.register("s-many", name="many", groups=many[:-1])["type"] == "registered"
        joined = conn.request({"type": "join", "group": many[-1]})
        assert (joined["type"], joined["code"]) == ("error", "over_capacity")
        assert conn.request({"type": "leave", "group": many[0]})["type"] == "ok"
        assert conn.request({"type": "join", "group": many[-1]})["type"] == "ok"
    listed = cli_json(cli_env, "list")
    assert [len(s["groups"]) for s in listed if s["name"] == "many"] in ([], [MAX_GROUPS])


def test_what_a_session_says_of_itself_is_bounded(
    cli_env: dict[str, str], runtime_home: Path, tmp_path: Path
) -> None:
    """A session's cwd, model and status go into every `list` answer: three sessions with a
    3 MB status each once made every `list` on the host too large to read."""
    start_broker(cli_env)
    big = "s" * (DESCRIPTION_CHARS + 1)
    with RawConn(runtime_home) as conn:
        for field, value in (("status", big), ("model", big), ("cwd", "/" * (CWD_CHARS + 1))):
            refused = conn.register(f"s-{field}", name=field, **{field: value})
            assert (refused["type"], refused["code"]) == ("error", "bad_field"), refused
        assert conn.register("s-ok", name="ok", status="s" * DESCRIPTION_CHARS)["type"] == (
            "registered"
        )
        refused = conn.request({"type": "set_status", "status": big})
        assert (refused["type"], refused["code"]) == ("error", "bad_field")
        assert conn.request({"type": "set_status", "status": "fine"})["type"] == "ok"
        assert [s["status"] for s in cli_json(cli_env, "list") if s["name"] == "ok"] == ["fine"]
    out = run_cli(cli_env, "set-status", "--as", "ok", "x" * (DESCRIPTION_CHARS + 1))
    assert out.returncode == 2 and "over 1000 characters" in out.stderr, out.stderr
    # a directory deeper than the bound is not described, and the session still registers
    deep = Identity.named(settings_for(cli_env), "deep", cwd="/d" * CWD_CHARS)
    assert deep.cwd is None


def test_a_session_list_too_large_for_a_frame_is_refused_not_dropped(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    """Many sessions at their bounds (many hosts' in a real store) can outgrow the frame a
    client reads: the answer is ``too_large``, and the connection goes on serving."""
    (runtime_home / "config.json").write_text(json.dumps({"max_frame_bytes": 64 * 1024}))
    start_broker(cli_env)
    conns = [RawConn(runtime_home) for _ in range(80)]
    try:
        for i, conn in enumerate(conns):
            status = str(i % 10) * DESCRIPTION_CHARS
            assert conn.register(f"s-{i}", name=f"w{i}", status=status)["type"] == "registered"
        refused = conns[0].request({"type": "list"})
        assert (refused["type"], refused["code"]) == ("error", "too_large"), refused
        assert "over the 65536-byte frame" in refused["message"]
        assert conns[0].request({"type": "ping"})["type"] == "pong"
        assert conns[1].request({"type": "set_status", "status": "short"})["type"] == "ok"
        for conn in conns[2:]:
            conn.close()
        listed = conns[0].request({"type": "list"})
        assert {s["status"] for s in listed["sessions"]} == {"0" * DESCRIPTION_CHARS, "short"}
    finally:
        for conn in conns:
            conn.close()


def test_a_frame_trickled_in_is_cut_off(cli_env: dict[str, str], runtime_home: Path) -> None:
    """A client that sends a frame's length and then its body a byte at a time holds the
    broker's memory for it: the body must arrive within ``frame_body_s`` of its length."""
    (runtime_home / "config.json").write_text(json.dumps({"frame_body_s": 1}))
    start_broker(cli_env)
    with RawConn(runtime_home) as slow:
        slow.send_bytes(struct.pack(">I", 1000) + b'{"type": ')
        error = slow.recv()
        assert error is not None and (error["type"], error["code"]) == ("error", "bad_frame")
        assert "did not arrive within 1 s" in error["message"]
        assert slow.recv() is None  # closed: the stream cannot be read on
    assert cli_json(cli_env, "list") == []  # everyone else is served
