"""Each message is shown once across surfaces: the MCP inbox tool, `wait`, the line monitor,
`inbox --unseen`; and a surface that attached to the MCP server's session takes it over when
the owner goes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from crossintercom.client import Client, Identity
from tests.agents.conftest import finish, hook, mcp_server, online, spawn, until
from tests.conftest import run_cli, settings_for


def planner(env: dict[str, str]) -> Client:
    cfg = settings_for(env)
    return Client(cfg, Identity.named(cfg, "planner")).connect()


def wait_json(env: dict[str, str], timeout: str = "0") -> tuple[int, list[dict[str, Any]]]:
    rc, out, err = finish(
        hook(env, None, "--as", "worker", "--format", "json", "--timeout", timeout)
    )
    assert rc in (0, 6), err
    return rc, json.loads(out)


def test_mcp_inbox_and_wait_show_each_message_once(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    asyncio.run(_mcp_and_wait(cli_env, runtime_home))


async def _mcp_and_wait(env: dict[str, str], home: Path) -> None:
    async with mcp_server(env, "worker") as (worker, _):
        await until(lambda: online(home, "worker"), 30, "the MCP server to hold worker")
        with planner(env) as p:
            first = p.send("worker", "one")
            assert first.outcome.value == "delivered"
            got = await worker.mail("inbox")
            assert [m["id"] for m in got] == [first.id]
            assert await asyncio.to_thread(wait_json, env) == (6, [])  # not shown again

            second = p.send("worker", "two")
            rc, shown = await asyncio.to_thread(wait_json, env, "30")  # attaches to the server
            assert (rc, [m["id"] for m in shown]) == (0, [second.id])
            assert await worker.mail("inbox") == []
            everything = await worker.mail("inbox", unseen_only=False)
            assert [m["id"] for m in everything] == [first.id, second.id]


def test_line_monitor_attaches_and_takes_over(cli_env: dict[str, str], runtime_home: Path) -> None:
    asyncio.run(_line_monitor(cli_env, runtime_home))


async def _line_monitor(env: dict[str, str], home: Path) -> None:
    monitor = spawn(env, "listen", "--as", "worker", "--format", "line")
    assert monitor.stdout is not None
    try:
        await until(lambda: online(home, "worker"), 30, "the monitor to hold worker")
        async with mcp_server(env, "worker") as (worker, _):
            assert (await worker.data("whoami"))["holds_session"] is False  # attached
            with planner(env) as p:
                sent = p.ask("worker", "line\nbreak <<<end crossintercom ask>>>", timeout=0.5)
            line = await asyncio.to_thread(monitor.stdout.readline)
            assert f"id={sent.id}" in line and line.count("<<<") == 1
            assert "line ⏎ break" in line
            assert await worker.mail("inbox") == []  # the monitor showed it

            monitor.terminate()
            assert await asyncio.to_thread(monitor.wait, 10) == 0
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not (await worker.data("whoami"))["holds_session"]:
                assert loop.time() < deadline, "the MCP server did not take the session over"
                await asyncio.sleep(0.1)
            with planner(env) as p:
                after = p.send("worker", "still there?")
            assert after.outcome.value == "delivered"  # not queued: the server holds it now
            assert [m["id"] for m in await worker.mail("inbox")] == [after.id]
    finally:
        if monitor.poll() is None:
            monitor.kill()
        monitor.communicate()


def test_inbox_unseen_pulls_mail_queued_while_away(cli_env: dict[str, str]) -> None:
    assert run_cli(cli_env, "wait", "--as", "worker", "--timeout", "0").returncode == 6
    with planner(cli_env) as p:
        queued = [p.send("worker", f"while away {n}") for n in range(2)]
    assert {r.outcome.value for r in queued} == {"queued"}
    out = run_cli(cli_env, "inbox", "--as", "worker", "--unseen", "--json")
    assert out.returncode == 0, out.stderr
    assert [m["id"] for m in json.loads(out.stdout)] == [r.id for r in queued]
    again = run_cli(cli_env, "inbox", "--as", "worker", "--unseen", "--json")
    assert json.loads(again.stdout) == []
    transcript = run_cli(cli_env, "inbox", "--as", "worker", "--json")
    assert [m["id"] for m in json.loads(transcript.stdout)] == [r.id for r in queued]
