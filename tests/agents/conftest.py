"""Helpers for the agent adapters: MCP servers driven by the SDK's stdio client, hook runs.

The multi-host fixtures (``cluster`` over SQLite and PostgreSQL) come from tests/relay.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from tests.conftest import sessions
from tests.pgharness import pg_server, pg_template, pg_url  # noqa: F401  (fixtures by name)
from tests.relay.conftest import (  # noqa: F401  (fixtures are found by name)
    CLI,
    Cluster,
    Host,
    backend,
    cluster,
    sqlite_store,
    store_url,
    wait_for,
)

__all__ = ["CLI", "Cluster", "Host", "wait_for"]

# What Claude Code and Codex write on a Stop hook's stdin (the fields each documents).
CLAUDE_STOP = {
    "session_id": "3f1c0c2e-claude",
    "transcript_path": "/tmp/transcript.jsonl",
    "cwd": "/tmp",
    "permission_mode": "default",
    "hook_event_name": "Stop",
    "stop_hook_active": False,
    "last_assistant_message": "Done.",
}
CODEX_STOP = {
    "session_id": "thread-1",
    "turn_id": "turn-1",
    "transcript_path": None,
    "cwd": "/tmp",
    "hook_event_name": "Stop",
    "model": "gpt-5",
    "permission_mode": "default",
    "stop_hook_active": False,
    "last_assistant_message": "Done.",
}


_HEADER = re.compile(r"^<<<crossintercom (ask|message|reply) from (\S+) (.*)>>>$")


def parse_mail(text: str) -> list[dict[str, Any]]:
    """The framed messages in a tool's text, oldest first: kind, from, id, reply_to, thread,
    flags and the quoted text (results that carry mail have no structured content)."""
    found: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.split("\n"):
        header = _HEADER.match(line)
        if header:
            fields = dict(f.split("=", 1) for f in header.group(3).split(" ") if "=" in f)
            current = {
                "kind": header.group(1),
                "from": header.group(2),
                "id": fields.get("id"),
                "reply_to": fields.get("reply_to"),
                "thread": fields.get("thread"),
                "flags": fields["flags"].split(",") if "flags" in fields else [],
                "lines": [],
            }
            found.append(current)
        elif line.startswith("<<<end crossintercom "):
            current = None
        elif current is not None and line.startswith("\u2502 "):
            current["lines"].append(line[2:])
    for m in found:
        m["message"] = "\n".join(x for x in m.pop("lines") if not x.startswith("[subject] "))
    return found


class Mcp:
    """One `crossintercom mcp` server and the SDK's client session talking to it."""

    def __init__(self, session: Any, name: str) -> None:
        self.session = session
        self.name = name

    async def call(self, tool: str, **arguments: Any) -> Any:
        return await self.session.call_tool(tool, arguments)

    async def text(self, tool: str, **arguments: Any) -> str:
        result = await self.call(tool, **arguments)
        assert not result.is_error, result.content[0].text
        return str(result.content[0].text)

    async def mail(self, tool: str, **arguments: Any) -> list[dict[str, Any]]:
        """The framed messages a mail-carrying tool returned (it has no structured content)."""
        result = await self.call(tool, **arguments)
        assert not result.is_error, result.content[0].text
        assert result.structured_content is None, "mail results carry no structured content"
        return parse_mail(str(result.content[0].text))

    async def data(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.call(tool, **arguments)
        assert not result.is_error, result.content[0].text
        return dict(result.structured_content)


@asynccontextmanager
async def mcp_server(
    env: Mapping[str, str], name: str, *extra: str
) -> AsyncIterator[tuple[Mcp, Any]]:
    """Start `crossintercom mcp --as NAME` the way a harness does; yield (client, init)."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "crossintercom.cli.main", "mcp", "--as", name, *extra],
        env=dict(env),
    )
    async with AsyncExitStack() as stack:
        read, write = await stack.enter_async_context(stdio_client(params))
        session = await stack.enter_async_context(ClientSession(read, write))
        init = await session.initialize()
        yield Mcp(session, name), init


async def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Async twin of ``wait_for``: poll a fact without blocking the event loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def spawn(
    env: Mapping[str, str], *args: str, stdin: int = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    """One `crossintercom ARGS...` process in the background, its output captured."""
    return subprocess.Popen(
        [*CLI, *args],
        env=dict(env),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def hook(
    env: Mapping[str, str], stdin: Mapping[str, Any] | None, *args: str
) -> subprocess.Popen[str]:
    """Run `crossintercom wait ...` as a harness runs a hook: JSON on stdin, then stdin closed."""
    proc = spawn(env, "wait", *args, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    if stdin is not None:
        proc.stdin.write(json.dumps(stdin))
    proc.stdin.close()
    proc.stdin = None  # closed, as the harness leaves it; communicate() must not touch it
    return proc


def with_stdin_open(env: Mapping[str, str], data: str, *args: str) -> tuple[int, str, str]:
    """Run a command that is given ``data`` on a stdin that is never closed."""
    proc = spawn(env, *args, stdin=subprocess.PIPE)
    held, proc.stdin = proc.stdin, None  # so communicate() cannot close it
    assert held is not None
    held.write(data)
    held.flush()
    try:
        return finish(proc, 30)
    finally:
        held.close()


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    assert proc.stdout is not None and proc.stderr is not None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"hook did not end in {timeout}s: {out!r} {err!r}") from None
    return proc.returncode, out, err


def online(home: Path, name: str) -> bool:
    """NAME is held by a live connection on the host whose runtime dir is ``home``."""
    return any(s["name"] == name and s["online"] for s in sessions(home, quiet=True) or ())


def waiting(proc: subprocess.Popen[str], home: Path, name: str = "worker") -> None:
    """Wait for the fact that a process (a waiter, a plugin) holds NAME's session."""

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"process exited {proc.returncode}: {proc.communicate()}")
        return online(home, name)

    wait_for(ready, 30, f"{name} to be online")
