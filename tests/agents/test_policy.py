"""Policy: the wake policy (every / asks / never) honoured by wait and the line monitor and
kept with the session; the per-sender rate limit on the sender's host and on the recipient's;
an ask that would cross an open ask in the other direction is refused (`crossing_ask`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from pathlib import Path

from crossintercom.client import Client, Identity
from crossintercom.inbox import Inbox
from tests.agents.conftest import (
    Cluster,
    finish,
    hook,
    mcp_server,
    online,
    spawn,
    until,
    wait_for,
    waiting,
)
from tests.conftest import cli_json, kill_broker, run_cli, settings_for


def client(env: dict[str, str], name: str) -> Client:
    cfg = settings_for(env)
    return Client(cfg, Identity.named(cfg, name)).connect()


def unseen_count(env: dict[str, str], name: str) -> int:
    """Messages in NAME's inbox never shown (read without showing them)."""
    cfg = settings_for(env)
    with Inbox.view(cfg.inbox_dir, Identity.named(cfg, name).id) as box:
        return sum(1 for e in box.unshown() if e.kind == "message")


def still_running(proc: subprocess.Popen[str], seconds: float) -> bool:
    """True if ``proc`` has not ended within ``seconds`` (a bounded negative check)."""
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return True
    return False


def test_wake_policy_asks_and_never_with_wait(cli_env: dict[str, str]) -> None:
    assert cli_json(cli_env, "set-wake", "--as", "worker", "asks") == {
        "name": "worker",
        "wake": "asks",
    }
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    proc = hook(cli_env, None, "--as", "worker", "--format", "json", "--timeout", "60")
    try:
        waiting(proc, home)
        with client(cli_env, "planner") as p:
            fyi = p.send("worker", "fyi: the build is green")
            assert fyi.outcome.value == "delivered"  # saved by the waiter...
            wait_for(lambda: unseen_count(cli_env, "worker") == 1, 10, "the fyi to be saved")
            assert still_running(proc, 2.0), "a plain message woke an 'asks' waiter"  # ...not shown
            question = p.ask("worker", "can you take the review?", timeout=0.5)
            assert question.outcome.value == "delivered"
        rc, out, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, err
    assert [m["id"] for m in json.loads(out)] == [fyi.id, question.id]  # woken: all of it

    cli_json(cli_env, "set-wake", "--as", "worker", "never")
    with client(cli_env, "planner") as p:
        late = p.ask("worker", "still there?", timeout=0.5)
    timed_out = run_cli(cli_env, "wait", "--as", "worker", "--format", "json", "--timeout", "1")
    assert (timed_out.returncode, json.loads(timed_out.stdout)) == (6, [])
    # Never woken is not lost: the message waits unseen for an explicit look.
    shown = cli_json(cli_env, "inbox", "--as", "worker", "--unseen")
    assert [m["id"] for m in shown] == [late.id]


def test_wake_policy_survives_a_broker_restart(cli_env: dict[str, str], runtime_home: Path) -> None:
    cli_json(cli_env, "set-wake", "--as", "worker", "never")
    kill_broker(runtime_home)
    with client(cli_env, "planner") as p:
        worker = next(s for s in p.list_sessions() if s.name == "worker")
    assert (worker.online, worker.wake) == (False, "never")
    (listed,) = [s for s in cli_json(cli_env, "list") if s["name"] == "worker"]
    assert listed["wake"] == "never"
    table = run_cli(cli_env, "list")
    assert table.returncode == 0 and "never" in table.stdout
    bad = run_cli(cli_env, "set-wake", "--as", "worker", "sometimes", "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["code"] == "invalid_argument"


def test_line_monitor_follows_the_wake_policy(cli_env: dict[str, str]) -> None:
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    cli_json(cli_env, "set-wake", "--as", "worker", "asks")
    monitor = spawn(cli_env, "listen", "--as", "worker", "--format", "line")
    assert monitor.stdout is not None
    try:
        waiting(monitor, home)
        with client(cli_env, "planner") as p:
            fyi = p.send("worker", "just so you know")
            wait_for(lambda: unseen_count(cli_env, "worker") == 1, 10, "the message to be saved")
            question = p.ask("worker", "ready?", timeout=0.5)
        first = monitor.stdout.readline()
        second = monitor.stdout.readline()
        assert f"id={fyi.id}" in first and f"id={question.id}" in second
    finally:
        monitor.terminate()
        monitor.communicate(timeout=10)


def test_mcp_set_wake_tool(cli_env: dict[str, str], runtime_home: Path) -> None:
    asyncio.run(_mcp_wake(cli_env, runtime_home))


async def _mcp_wake(env: dict[str, str], home: Path) -> None:
    async with mcp_server(env, "worker", "--profile", "all") as (worker, _):
        await until(lambda: online(home, "worker"), 30, "the MCP server to hold worker")
        assert (await worker.data("whoami"))["wake"] == "every"
        assert await worker.data("set_wake", policy="asks") == {"wake": "asks"}
        assert (await worker.data("whoami"))["wake"] == "asks"
        bad = await worker.call("set_wake", policy="sometimes")
        assert bad.is_error and bad.structured_content["error"]["code"] == "invalid_argument"
        assert (await worker.data("whoami"))["wake"] == "asks"  # nothing changed
        listed = await worker.text("list_sessions")
        mine = [line for line in listed.splitlines() if line.startswith("- worker@")]
        assert len(mine) == 1 and "; wake asks;" in mine[0], listed


def test_wake_policy_is_in_the_roster_other_hosts_read(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    b.listen("worker")
    b.cli_json("set-wake", "--as", "worker", "asks")

    def seen_on_a() -> bool:
        return any(s.name == "worker" and s.wake == "asks" for s in a.sessions())

    wait_for(seen_on_a, 30, "A to see worker@B's wake policy")


# --- rate limit ------------------------------------------------------------------------------


def test_rate_limit_refuses_the_sender_over_it(cli_env: dict[str, str]) -> None:
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    (home / "config.json").write_text(
        json.dumps({"rate_limit_count": 3, "rate_limit_window_s": 600})
    )
    with client(cli_env, "worker"), client(cli_env, "planner") as p:
        first = p.send("worker", "one", message_id=str(uuid.uuid4()))
        sent = [first] + [p.send("worker", f"n{n}") for n in range(2)]
        assert {r.outcome.value for r in sent} == {"delivered"}
        over = p.send("worker", "one too many")
        assert (over.outcome.value, over.code) == ("refused", "rate_limited")
        assert over.message is not None and "rate limit" in over.message
        # A retry of a message already counted is not a new message.
        again = p.send("worker", "one", message_id=first.id)
        assert again.outcome.value == "delivered"
        with client(cli_env, "someone-else") as other:
            assert other.send("worker", "hi").outcome.value == "delivered"  # per sender
    cli = run_cli(cli_env, "send", "--as", "planner", "--to", "worker", "--json", "and again")
    assert cli.returncode == 3
    assert json.loads(cli.stdout)["error"]["code"] == "rate_limited"


def test_rate_limit_is_enforced_again_on_mail_from_other_hosts(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", B={"rate_limit_count": 2, "rate_limit_window_s": 600})
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    with a.client("planner") as p:
        results = [p.send("worker", f"loop {n}") for n in range(3)]
    assert [r.outcome.value for r in results] == ["delivered", "delivered", "refused"]
    assert results[2].code == "rate_limited"
    assert [worker.next_message()["id"] for _ in range(2)] == [r.id for r in results[:2]]
    worker.no_message(1.0)


# --- crossing asks ---------------------------------------------------------------------------


def test_an_ask_crossing_an_open_ask_is_refused(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    planner = a.listen("planner")
    b.listen("worker")
    a.wait_sees("worker", "B")
    b.wait_sees("planner", "A")
    waiting_ask = spawn(
        b.env, "ask", "--as", "worker", "--to", "planner", "--timeout", "120", "--json", "which?"
    )
    try:
        asked = planner.next_message()
        assert asked["expects_reply"] is True
        crossing = a.cli("ask", "--as", "planner", "--to", "worker", "--json", "and you?")
        assert crossing.returncode == 3, crossing.stdout
        err = json.loads(crossing.stdout)["error"]
        assert err["code"] == "crossing_ask" and asked["id"] in err["message"]
        # A send is fine, and so is the answer the other side waits for.
        assert a.cli_json("send", "--as", "planner", "--to", "worker", "hm")["outcome"] == (
            "delivered"
        )
        a.cli_json("reply", "--as", "planner", "--reply-to", asked["id"], "the first one")
        rc, out, err_text = finish(waiting_ask)
        assert rc == 0, err_text
        assert json.loads(out)["reply"]["message"] == "the first one"
    finally:
        if waiting_ask.poll() is None:
            waiting_ask.kill()
    started = time.monotonic()
    later = a.cli("ask", "--as", "planner", "--to", "worker", "--timeout", "1", "--json", "now?")
    assert later.returncode == 6, later.stdout  # delivered, no reply in time: not crossing
    assert time.monotonic() - started < 30
