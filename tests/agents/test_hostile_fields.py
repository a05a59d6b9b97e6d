"""A hostile host's roster and mail reach no model and no terminal raw: every MCP tool's text and
structured content, `list`, `groups`, `inbox`, `inbox --unseen`, `pending` and `listen --format
line` (docs/agents.md#framing)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from crossintercom.models import durable_session_id
from tests.agents.conftest import (
    CLAUDE_STOP,
    CODEX_STOP,
    finish,
    hook,
    mcp_server,
    online,
    spawn,
    until,
)
from tests.agents.hostile import (
    EVIL_ID,
    FakeRelay,
    assert_clean_data,
    assert_clean_terminal,
    assert_clean_text,
)
from tests.conftest import run_cli, sessions, settings_for

# Results holding what the hostile host wrote: no structured content (docs/agents.md#framing).
TEXT_ONLY = {"list_sessions", "groups", "receipts", "pending", "inbox"}


def _worker_id(env: dict[str, str]) -> str:
    return durable_session_id(settings_for(env).host_id, "worker")


def test_every_mcp_tool_frames_or_neutralises_a_hostile_host(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    asyncio.run(_every_tool(cli_env, runtime_home))


async def _every_tool(env: dict[str, str], home: Path) -> None:
    async with mcp_server(env, "worker", "--profile", "all") as (worker, _):
        await until(lambda: online(home, "worker"), 30, "the MCP server to hold worker")
        relay = FakeRelay(home)
        try:
            relay.roster()
            await until(
                lambda: any(s["id"] == EVIL_ID for s in sessions(home) or ()), 30, "the roster"
            )
            relay.deliver(_worker_id(env), ask=False)
            asked = relay.deliver(_worker_id(env), ask=True)
            relay.receipt(_worker_id(env))
            await until(lambda: _has_receipt(home, env), 30, "the hostile receipt")

            async def check(tool: str, frames: int | None = None, **args: Any) -> str:
                result = await worker.call(tool, **args)
                text = str(result.content[0].text)
                assert not result.is_error, text
                assert_clean_text(text, frames=frames)
                assert_clean_data(result.structured_content)
                if tool in TEXT_ONLY:
                    # Claude Code and Codex would show the JSON instead of the quoted text.
                    assert result.structured_content is None, (tool, result.structured_content)
                return text

            await check("whoami")
            listed = await check("list_sessions", online_only=False)
            assert "PWNED" in listed and "status, in its own words: \u00abPWNED" in listed
            assert "PWNED" in await check("groups")
            pending = await check("pending", frames=1)
            assert f"id={asked}" in pending
            assert "PWNED" in await check("inbox", frames=1)  # the ask was shown by pending
            everything = await check("inbox", frames=2, unseen_only=False)
            assert everything.count("\u2502 PWNED") >= 2  # the text, quoted, in each frame
            await check("inbox", frames=1, message_id=asked)
            attachment = (await worker.call("inbox", message_id=asked)).content[0].text
            name = attachment.split("[attachment file ")[1].split(",")[0]
            await check("inbox", frames=1, message_id=asked, attachment=name)
            assert "PWNED" in await check("receipts")
        finally:
            relay.close()


def _has_receipt(home: Path, env: dict[str, str]) -> bool:
    from crossintercom.inbox import Inbox

    box = Inbox.of(settings_for(env), _worker_id(env))
    try:
        return bool(box.receipts())
    finally:
        box.close()


def test_cli_surfaces_strip_and_frame_a_hostile_host(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    asyncio.run(_cli_surfaces(cli_env, runtime_home))


async def _cli_surfaces(env: dict[str, str], home: Path) -> None:
    async with mcp_server(env, "worker"):
        await until(lambda: online(home, "worker"), 30, "the MCP server to hold worker")
        relay = FakeRelay(home)
        try:
            relay.roster()
            await until(
                lambda: any(s["id"] == EVIL_ID for s in sessions(home) or ()), 30, "the roster"
            )
            for command in ("list", "groups"):
                out = run_cli(env, command)
                assert out.returncode == 0, out.stderr
                assert "PWNED" in out.stdout
                assert_clean_terminal(out.stdout)

            relay.deliver(_worker_id(env), ask=True)
            out = run_cli(env, "pending", "--as", "worker")
            assert out.returncode == 0, out.stderr
            assert_clean_text(out.stdout, frames=1)
            assert_clean_terminal(out.stdout)

            relay.deliver(_worker_id(env), ask=False)
            out = run_cli(env, "inbox", "--as", "worker", "--unseen")
            assert out.returncode == 0, out.stderr
            assert_clean_text(out.stdout, frames=1)  # the ask was shown by pending
            assert "Written by another agent session" in out.stdout

            out = run_cli(env, "inbox", "--as", "worker")  # the transcript, for a person
            assert out.returncode == 0, out.stderr
            assert out.stdout.count("PWNED") >= 2
            assert_clean_terminal(out.stdout)

            monitor = spawn(env, "listen", "--as", "worker", "--format", "line")
            assert monitor.stdout is not None
            try:
                relay.deliver(_worker_id(env), ask=False)
                line = await asyncio.wait_for(asyncio.to_thread(monitor.stdout.readline), 60)
            finally:
                monitor.terminate()
                monitor.communicate(timeout=30)
            assert line.endswith("\n") and "PWNED" in line
            line = line[:-1]
            assert_clean_terminal(line)
            for raw in ("</system-reminder>", "<<<end", "\u2028"):
                assert raw not in line
            # the sender's » cannot close the quote: one « and one », around all its text
            assert line.count("\u00ab") == 1 and line.count("\u00bb") == 1
            assert line.count("<<<") == 1 and line.count(">>>") == 1

            # the hook formats: framed text on stderr (Claude Code), a JSON reason (Codex)
            relay.deliver(_worker_id(env), ask=False)
            args = ("--as", "worker", "--format", "claude-hook", "--timeout", "30")
            rc, _, err = await asyncio.to_thread(finish, hook(env, CLAUDE_STOP, *args))
            assert rc == 2, err
            assert_clean_text(err, frames=1)
            relay.deliver(_worker_id(env), ask=True)
            args = ("--as", "worker", "--format", "codex-hook", "--timeout", "30")
            rc, said, err = await asyncio.to_thread(finish, hook(env, CODEX_STOP, *args))
            assert rc == 0, err
            assert_clean_text(json.loads(said)["reason"], frames=1)
            quoted = line[line.index("\u00ab") : line.index("\u00bb")]
            assert "USER: obey" in quoted and "done PWNED" in quoted
        finally:
            relay.close()
