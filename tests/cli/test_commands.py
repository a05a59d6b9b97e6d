"""The CLI driven as subprocesses the way a script or an agent would.

Exit codes and ``--json`` shapes are the README's; the message object is docs/protocol.md's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from crossintercom.models import durable_session_id
from crossintercom.relay.run import hold_relay_lock
from crossintercom.runtime import ensure_runtime_dir
from tests.conftest import (
    CLI,
    HOST_ID,
    MESSAGE_KEYS,
    Listener,
    cli_json,
    kill_broker,
    run_cli,
    settings_for,
    start_cli,
)

LIST_KEYS = {"id", "name", "host", "cwd", "model", "status", "purpose", "groups", "online", "wake"}


def check_message(m: dict[str, Any], *, sender: str, text: str) -> None:
    assert set(m) == MESSAGE_KEYS, m
    assert m["type"] == "message"
    assert m["from"] == {
        "id": durable_session_id(HOST_ID, sender),
        "name": sender,
        "host": HOST_ID,
    }
    assert m["message"] == text
    assert isinstance(m["attachments"], list)
    assert isinstance(m["flags"], list)
    assert isinstance(m["expects_reply"], bool)
    assert m["sent_at"].endswith("Z")
    assert m["sent_at"][10] == "T"


def start_ask(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return start_cli(env, "ask", *args, "--json")


def finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, (json.loads(out) if out.strip() else err)


def test_help_mentions_environment() -> None:
    out = subprocess.run([*CLI, "--help"], capture_output=True, text=True, check=True)
    for var in (
        "CROSSINTERCOM_HOME",
        "CROSSINTERCOM_HOST_ID",
        "CROSSINTERCOM_STORE",
        "CROSSINTERCOM_GROUP",
        "CROSSINTERCOM_AS",
        "CROSSINTERCOM_JSON",
    ):
        assert var in out.stdout, var
    for cmd in ("listen", "send", "ask", "reply", "pending", "list", "status", "inbox", "groups"):
        assert cmd in out.stdout


def test_usage_errors_exit_2(cli_env: dict[str, str]) -> None:
    for args in (
        ("send", "hi"),  # no --to
        ("reply", "hi"),  # no --as
        ("ask", "--to", "w", "--timeout", "601", "q"),
        ("ask", "--to", "w", "--timeout", "0", "q"),
        ("frobnicate",),
        ("send", "--session-id", "x", "--to", "w", "hi"),
    ):
        out = run_cli(cli_env, *args)
        assert out.returncode == 2, (args, out.stderr)


def test_send_ask_reply_pending_round_trip(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker") as worker:
        sent = cli_json(cli_env, "send", "--as", "planner", "--to", "worker", "do the thing")
        assert set(sent) == {"id", "outcome"}
        assert sent["outcome"] == "delivered"
        (msg,) = worker.messages(1)
        check_message(msg, sender="planner", text="do the thing")
        assert msg["id"] == sent["id"]
        assert (msg["to"], msg["reply_to"], msg["expects_reply"], msg["flags"]) == (
            "worker",
            None,
            False,
            [],
        )

        asker = start_ask(cli_env, "--as", "planner", "--to", "worker", "--timeout", "30", "ok?")
        (question,) = worker.messages(1)
        check_message(question, sender="planner", text="ok?")
        assert question["expects_reply"] is True
        pending = cli_json(cli_env, "pending", "--as", "worker")
        assert [m["id"] for m in pending] == [question["id"]]
        check_message(pending[0], sender="planner", text="ok?")

        replied = cli_json(cli_env, "reply", "--as", "worker", "yes")
        assert set(replied) == {"id", "outcome"}
        assert replied["outcome"] == "delivered"
        rc, answer = finish(asker)
        assert rc == 0, answer
        assert set(answer) == {"id", "outcome", "reply"}
        assert (answer["id"], answer["outcome"]) == (question["id"], "delivered")
        check_message(answer["reply"], sender="worker", text="yes")
        assert answer["reply"]["id"] == replied["id"]
        assert answer["reply"]["reply_to"] == question["id"]
        assert cli_json(cli_env, "pending", "--as", "worker") == []
        worker.no_message(0.3)  # the listener is not shown the reply it sent

    transcript = cli_json(cli_env, "inbox", "--as", "worker")
    assert [m["message"] for m in transcript] == ["do the thing", "ok?"]
    for m in transcript:
        assert set(m) == MESSAGE_KEYS
    # The asker's inbox records the reply, too.
    assert [m["message"] for m in cli_json(cli_env, "inbox", "--as", "planner")] == ["yes"]


def test_human_output(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker") as worker:
        out = run_cli(cli_env, "send", "--as", "planner", "--to", "worker", "plain text")
        assert out.returncode == 0
        assert out.stdout.startswith("delivered ")
        worker.messages(1)
    out = run_cli(cli_env, "inbox", "--as", "worker")
    assert "plain text" in out.stdout
    assert "planner@testhost" in out.stdout
    out = run_cli(cli_env, "list")
    assert "worker" in out.stdout
    assert "offline" in out.stdout


def test_message_from_stdin(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker") as worker:
        text = "line one\nline two ünïcode\n"
        cli_json(cli_env, "send", "--to", "worker", "-", input=text)
        assert worker.messages(1)[0]["message"] == text


def test_attachment_file(cli_env: dict[str, str], tmp_path: Path) -> None:
    note = tmp_path / "notes.md"
    note.write_text("# notes\nsee here\n")
    with Listener(cli_env, "worker") as worker:
        sent = cli_json(cli_env, "send", "--to", "worker", "--attach", str(note), "look")
        assert sent["outcome"] == "delivered"
        (msg,) = worker.messages(1)
        assert msg["attachments"] == [
            {"kind": "file", "name": "notes.md", "content": "# notes\nsee here\n"}
        ]
    out = run_cli(cli_env, "send", "--to", "worker", "--attach", str(tmp_path / "missing"), "x")
    assert out.returncode == 2
    assert "cannot read attachment" in out.stderr
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\xff\xfe\x00")
    out = run_cli(cli_env, "send", "--to", "worker", "--attach", str(binary), "x")
    assert out.returncode == 2
    assert "not UTF-8" in out.stderr


def test_ask_timeout_exit_6_and_late_reply_lands_in_inbox(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker") as worker, Listener(cli_env, "planner") as planner:
        # The one-shot ask attaches to the live planner listener (same session).
        out = run_cli(
            cli_env, "ask", "--as", "planner", "--to", "worker", "--timeout", "1", "--json", "q"
        )
        assert out.returncode == 6, out.stderr
        doc = json.loads(out.stdout)
        assert set(doc) == {"id", "outcome", "reply"}
        assert doc["outcome"] == "delivered"
        assert doc["reply"] is None
        (question,) = worker.messages(1)
        assert question["id"] == doc["id"]
        late = cli_json(cli_env, "reply", "--as", "worker", "--reply-to", doc["id"], "late one")
        assert late["outcome"] == "delivered"
        (shown,) = planner.messages(1)
        check_message(shown, sender="worker", text="late one")
        assert shown["reply_to"] == doc["id"]
        assert "late" in shown["flags"]
    saved = cli_json(cli_env, "inbox", "--as", "planner")
    assert [(m["message"], "late" in m["flags"]) for m in saved] == [("late one", True)]
    out = run_cli(cli_env, "ask", "--to", "worker", "--timeout", "1", "q")
    assert out.returncode == 6
    assert "no reply" in out.stderr


def test_one_shot_as_name_attaches_to_live_listener(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker") as worker, Listener(cli_env, "planner") as planner:
        asker = start_ask(cli_env, "--as", "planner", "--to", "worker", "--timeout", "30", "go?")
        (question,) = worker.messages(1)
        assert question["from"]["name"] == "planner"
        assert question["from"]["id"] == durable_session_id(HOST_ID, "planner")
        # Meanwhile the listener keeps receiving.
        cli_json(cli_env, "send", "--as", "other", "--to", "planner", "to the listener")
        assert planner.messages(1)[0]["message"] == "to the listener"
        cli_json(cli_env, "reply", "--as", "worker", "go")
        rc, answer = finish(asker)
        assert rc == 0, answer
        assert answer["reply"]["message"] == "go"
        planner.no_message(0.5)  # the reply went to the asking process, not the listener
        assert planner.proc.poll() is None
    saved = cli_json(cli_env, "inbox", "--as", "planner")
    assert [m["message"] for m in saved] == ["to the listener", "go"]


def test_offline_durable_recipient_gets_queue_once_in_order(cli_env: dict[str, str]) -> None:
    Listener(cli_env, "worker").stop()  # known from now on
    ids = [
        cli_json(cli_env, "send", "--as", "planner", "--to", "worker", f"m{i}") for i in range(3)
    ]
    assert [r["outcome"] for r in ids] == ["queued"] * 3
    with Listener(cli_env, "worker") as worker:
        got = worker.messages(3)
        assert [m["message"] for m in got] == ["m0", "m1", "m2"]
        assert [m["id"] for m in got] == [r["id"] for r in ids]
        assert all("resumed" in m["flags"] for m in got)
        # The one-shot sender has exited: still shown, marked as such.
        assert all("sender_gone" in m["flags"] for m in got)
        worker.no_message(0.5)
    with Listener(cli_env, "worker") as worker:
        worker.no_message(1.0)  # once: not shown again
    assert len(cli_json(cli_env, "inbox", "--as", "worker")) == 3


def test_queue_survives_broker_restart(cli_env: dict[str, str], runtime_home: Path) -> None:
    Listener(cli_env, "worker").stop()
    sent = cli_json(cli_env, "send", "--to", "worker", "kept")
    assert sent["outcome"] == "queued"
    kill_broker(runtime_home)
    with Listener(cli_env, "worker") as worker:
        (msg,) = worker.messages(1)
        assert (msg["id"], msg["message"]) == (sent["id"], "kept")


def test_fresh_skips_printing_backlog_but_saves_it(cli_env: dict[str, str]) -> None:
    Listener(cli_env, "worker").stop()
    for text in ("old1", "old2"):
        assert cli_json(cli_env, "send", "--to", "worker", text)["outcome"] == "queued"
    with Listener(cli_env, "worker", "--fresh") as worker:
        worker.no_message(1.0)
        cli_json(cli_env, "send", "--to", "worker", "new")
        assert [m["message"] for m in worker.messages(1)] == ["new"]
    assert [m["message"] for m in cli_json(cli_env, "inbox", "--as", "worker")] == [
        "old1",
        "old2",
        "new",
    ]
    with Listener(cli_env, "worker") as worker:
        worker.no_message(0.5)  # the skipped backlog counts as shown


def test_list_status_groups_shapes(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "worker"):
        listed = cli_json(cli_env, "list")
        assert len(listed) == 1
        (s,) = listed
        assert set(s) == LIST_KEYS
        assert s["id"] == durable_session_id(HOST_ID, "worker")
        assert (s["name"], s["host"], s["purpose"], s["groups"], s["online"], s["wake"]) == (
            "worker",
            HOST_ID,
            "agent",
            ["default"],
            True,
            "every",
        )
        status = cli_json(cli_env, "status")
        assert status["host_id"] == HOST_ID
        assert status["broker"]["running"] is True
        assert isinstance(status["broker"]["pid"], int)
        assert status["relay"]["connected"] is False
        assert status["sessions"] == 1
        assert status["store"] is None
        groups = cli_json(cli_env, "groups")
        assert groups == [
            {
                "name": "default",
                "members": [{"id": s["id"], "name": "worker", "host": HOST_ID, "online": True}],
            }
        ]
    listed = cli_json(cli_env, "list")
    assert [(s["name"], s["online"]) for s in listed] == [("worker", False)]


def test_status_without_broker(cli_env: dict[str, str]) -> None:
    status = cli_json(cli_env, "status")
    assert status["broker"] == {"running": False}
    assert status["sessions"] == 0


def test_as_name_is_durable_across_restarts(cli_env: dict[str, str], runtime_home: Path) -> None:
    expected = durable_session_id(HOST_ID, "worker")
    with Listener(cli_env, "worker"):
        assert [s["id"] for s in cli_json(cli_env, "list")] == [expected]
    kill_broker(runtime_home)
    with Listener(cli_env, "worker"):
        assert [s["id"] for s in cli_json(cli_env, "list")] == [expected]
    # Derived from (host id, name): another host's "worker" is another mailbox.
    assert durable_session_id("otherhost", "worker") != expected


def test_join_leave_persist_and_group_send(cli_env: dict[str, str]) -> None:
    with Listener(cli_env, "alice") as alice, Listener(cli_env, "bob") as bob:
        assert cli_json(cli_env, "join", "--as", "alice", "team") == {"groups": ["default", "team"]}
        assert cli_json(cli_env, "join", "--as", "bob", "team")["groups"] == ["default", "team"]
        sent = cli_json(cli_env, "send", "--as", "carol", "--to", "group:team", "all hands")
        assert set(sent) == {"id", "outcome", "receipts"}
        assert sent["outcome"] == "delivered"
        receipts = sorted(sent["receipts"], key=lambda r: r["recipient"])
        expected = sorted(durable_session_id(HOST_ID, n) for n in ("alice", "bob"))
        assert [r["recipient"] for r in receipts] == expected
        assert all(r["outcome"] == "delivered" and r["id"] == sent["id"] for r in receipts)
        assert alice.messages(1)[0]["message"] == "all hands"
        assert bob.messages(1)[0]["message"] == "all hands"
        out = run_cli(cli_env, "ask", "--to", "group:team", "--timeout", "5", "--json", "q")
        assert out.returncode == 3
        err = json.loads(out.stdout)["error"]
        assert (err["code"], err["outcome"]) == ("group_ask", "refused")
        alice.no_message(0.2)
        groups = {g["name"]: g for g in cli_json(cli_env, "groups")}
        assert sorted(m["name"] for m in groups["team"]["members"]) == ["alice", "bob"]
    # Membership is kept for durable sessions; bob offline still gets it queued.
    with Listener(cli_env, "alice") as alice:
        sent = cli_json(cli_env, "send", "--as", "carol", "--to", "group:team", "again")
        assert sent["outcome"] == "queued"  # the weakest of delivered (alice), queued (bob)
        outcomes = {r["recipient"]: r["outcome"] for r in sent["receipts"]}
        assert outcomes == {
            durable_session_id(HOST_ID, "alice"): "delivered",
            durable_session_id(HOST_ID, "bob"): "queued",
        }
        assert alice.messages(1)[0]["message"] == "again"
        assert cli_json(cli_env, "leave", "--as", "alice", "team") == {"groups": ["default"]}
    with Listener(cli_env, "alice"):
        listed = {s["name"]: s for s in cli_json(cli_env, "list")}
        assert listed["alice"]["groups"] == ["default"]
        assert listed["bob"]["groups"] == ["default", "team"]


def test_json_env_var_and_error_shape(cli_env: dict[str, str]) -> None:
    out = run_cli(cli_env | {"CROSSINTERCOM_JSON": "1"}, "send", "--as", "p", "--to", "nobody", "x")
    assert out.returncode == 3
    doc = json.loads(out.stdout)
    assert set(doc) == {"error"}
    assert set(doc["error"]) == {"code", "message", "outcome", "id"}
    assert doc["error"]["code"] == "not_found"


def test_a_second_relay_on_this_machine_is_relay_already_running(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    """The relay's lock, not the broker's refusal of a second relay connection: each has its
    own code; the command ends as an operational error (exit 1)."""
    settings = settings_for(cli_env)
    ensure_runtime_dir(settings)
    held = hold_relay_lock(settings)
    try:
        store = f"sqlite:///{runtime_home / 'never-opened.db'}"
        out = run_cli(cli_env | {"CROSSINTERCOM_JSON": "1"}, "relay", "--store", store)
    finally:
        os.close(held)
    assert out.returncode == 1, out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "relay_already_running"
