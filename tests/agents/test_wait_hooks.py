"""`crossintercom wait` run the way Claude Code and Codex run a Stop hook: their JSON on stdin,
then exit code, stdout and stderr checked against each harness's contract."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from crossintercom.client import Client, Identity
from crossintercom.errors import CrossintercomError
from tests.agents.conftest import (
    CLAUDE_STOP,
    CODEX_STOP,
    Cluster,
    Host,
    finish,
    hook,
    wait_for,
    waiting,
    with_stdin_open,
)
from tests.conftest import settings_for


def cross_host_waiter(a: Host, b: Host, fmt: str, stdin: dict[str, Any]) -> subprocess.Popen[str]:
    proc = hook(a.env, stdin, "--as", "worker", "--format", fmt, "--timeout", "120")
    waiting(proc, a.home)
    b.wait_sees("worker", "A")
    return proc


def test_claude_hook_exits_2_with_the_framed_mail_on_stderr(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    proc = cross_host_waiter(a, b, "claude-hook", CLAUDE_STOP)
    sent = b.cli_json("send", "--as", "planner", "--to", "worker", "please rebase")
    assert sent["outcome"] == "delivered"
    rc, out, err = finish(proc)
    assert rc == 2, (out, err)
    assert out == ""
    assert f"id={sent['id']}" in err and "from planner@B" in err
    assert "│ please rebase" in err and "not by your user" in err
    # shown once: nothing is left for the next waiter
    again = a.cli("wait", "--as", "worker", "--timeout", "0", "--format", "json")
    assert (again.returncode, again.stdout.strip()) == (6, "[]")


def test_codex_hook_blocks_the_stop_with_the_mail_as_reason(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    proc = cross_host_waiter(a, b, "codex-hook", CODEX_STOP)
    b.cli_json("send", "--as", "planner", "--to", "worker", "tests are red")
    rc, out, err = finish(proc)
    assert rc == 0, err
    decision = json.loads(out)
    assert decision["decision"] == "block"
    assert "from planner@B" in decision["reason"] and "│ tests are red" in decision["reason"]


def test_mail_queued_while_away_wakes_once_with_the_whole_burst(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    known = a.cli("wait", "--as", "worker", "--timeout", "0")  # NAME becomes a known mailbox
    assert known.returncode == 6, known.stderr
    b.wait_sees("worker", "A", online=False)
    ids = []
    for n in range(3):
        sent = b.cli_json("send", "--as", "planner", "--to", "worker", f"part {n}")
        assert sent["outcome"] == "queued"
        ids.append(sent["id"])
    wait_for(lambda: a.relay_connected() and _queued_here(a) >= 3, 30, "the mail to reach A")
    rc, _, err = finish(hook(a.env, CLAUDE_STOP, "--as", "worker", "--format", "claude-hook"))
    assert rc == 2
    assert err.startswith("crossintercom: 3 new messages for worker")
    assert [err.index(f"id={i}") for i in ids] == sorted(err.index(f"id={i}") for i in ids)
    assert "flags=resumed" in err


def _queued_here(host: Host) -> int:
    try:
        with Client(host.settings, None, spawn=False, reconnect=False) as c:
            return c.status().queued
    except CrossintercomError:
        return 0


def test_codex_continuation_keeps_listening(cli_env: dict[str, str], runtime_home: Path) -> None:
    """After a mail-driven continuation (stop_hook_active) the hook still waits for the next
    message, so the session stays woken by mail (docs/agents.md#wait)."""
    active = CODEX_STOP | {"stop_hook_active": True}
    proc = hook(cli_env, active, "--as", "worker", "--format", "codex-hook", "--timeout", "60")
    waiting(proc, runtime_home)
    settings = settings_for(cli_env)
    with Client(settings, Identity.named(settings, "planner")) as planner:
        assert planner.send("worker", "one more thing").outcome.value == "delivered"
    rc, out, _ = finish(proc, 30)
    assert rc == 0 and json.loads(out)["decision"] == "block"


def test_timeout_exits(cli_env: dict[str, str]) -> None:
    args = ("--as", "worker", "--timeout", "0.2")
    rc, out, err = finish(hook(cli_env, None, *args, "--format", "json"))
    assert (rc, out.strip()) == (6, "[]")
    rc, out, err = finish(hook(cli_env, None, *args, "--format", "text"))
    assert (rc, out) == (6, "")
    rc, out, err = finish(hook(cli_env, CLAUDE_STOP, *args, "--format", "claude-hook"))
    assert (rc, out, err) == (0, "", "")
    rc, out, err = finish(hook(cli_env, CODEX_STOP, *args, "--format", "codex-hook"))
    assert (rc, out, err) == (0, "", "")


def test_one_waiter_per_name(cli_env: dict[str, str], runtime_home: Path) -> None:
    first = hook(cli_env, None, "--as", "worker", "--format", "json", "--timeout", "120")
    waiting(first, runtime_home)
    rc, out, _ = finish(hook(cli_env, None, "--as", "worker", "--format", "json", "--timeout", "1"))
    assert rc == 7
    assert json.loads(out)["error"]["code"] == "waiter_busy"
    # a hook started at a later Stop takes over; the older waiter ends without showing anything
    newer = hook(cli_env, CLAUDE_STOP, "--as", "worker", "--format", "claude-hook")
    assert finish(first) == (6, "[]\n", "")
    waiting(newer, runtime_home)
    settings = settings_for(cli_env)
    with Client(settings, Identity.named(settings, "planner")) as planner:
        for n in range(3):  # a live burst: one wake with all of it
            assert planner.send("worker", f"burst {n}").outcome.value == "delivered"
    rc, out, err = finish(newer)
    assert rc == 2 and out == ""
    assert err.startswith("crossintercom: 3 new messages for worker")


def test_text_format_prints_framed_mail(cli_env: dict[str, str], runtime_home: Path) -> None:
    proc = hook(cli_env, None, "--as", "worker", "--timeout", "60")
    waiting(proc, runtime_home)
    settings = settings_for(cli_env)
    with Client(settings, Identity.named(settings, "planner")) as planner:
        sent = planner.ask("worker", "which branch?", timeout=0.5)
    rc, out, err = finish(proc)
    assert rc == 0, err
    assert f"<<<crossintercom ask from planner@testhost id={sent.id}>>>" in out
    assert f'reply_to="{sent.id}"' in out


def test_hook_input_is_read_even_when_stdin_stays_open(cli_env: dict[str, str]) -> None:
    rc, out, err = with_stdin_open(
        cli_env,
        json.dumps(CODEX_STOP),
        "wait",
        *("--as", "worker", "--format", "codex-hook", "--timeout", "0.5"),
    )
    # the input was read as it came and the short wait ended: the open stdin held nothing
    assert (rc, out) == (0, ""), err


def test_hook_input_nested_past_any_parser_is_no_input(cli_env: dict[str, str]) -> None:
    for fmt in ("claude-hook", "codex-hook"):
        rc, out, err = with_stdin_open(
            cli_env, "[" * 100_000, "wait", "--as", "worker", "--format", fmt, "--timeout", "0.2"
        )
        assert (rc, out, err) == (0, "", ""), err


def test_a_pid_setting_that_is_no_pid_is_ignored(cli_env: dict[str, str]) -> None:
    for key, value in (
        ("CLAUDE_PID", "²"),
        ("CROSSINTERCOM_HARNESS_PID", "²"),
        ("CROSSINTERCOM_HARNESS_PID", "9" * 5000),
    ):
        env = {**cli_env, key: value}
        rc, out, err = finish(
            hook(env, CLAUDE_STOP, "--as", "worker", "--format", "claude-hook", "--timeout", "0.2")
        )
        assert (rc, out, err) == (0, "", ""), (key, err)


def test_a_lock_file_naming_no_pid_makes_a_hook_stand_aside(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    first = hook(cli_env, None, "--as", "worker", "--format", "json", "--timeout", "120")
    waiting(first, runtime_home)
    (lock,) = (runtime_home / "agents").glob("*.wait.lock")
    lock.write_text("²\n")  # what the holder wrote, overwritten: no pid to ask
    rc, out, err = finish(hook(cli_env, CLAUDE_STOP, "--as", "worker", "--format", "claude-hook"))
    assert (rc, out) == (0, ""), err
    assert err.startswith("crossintercom: another `crossintercom wait` already waits"), err
    first.terminate()
    assert finish(first) == (6, "[]\n", "")
