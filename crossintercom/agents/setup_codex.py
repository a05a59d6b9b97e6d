"""Codex: ``[mcp_servers.crossintercom]`` in ``DIR/config.toml``; the Stop hook in
``DIR/hooks.json``, where ``DIR`` is the Codex home (docs/agents.md#codex).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit

from crossintercom.agents.setup_common import (
    SERVER_KEY,
    Agent,
    Change,
    json_change,
    read_text,
    stop_hooks,
)
from crossintercom.errors import UsageError

# The hook waits this long, and Codex lets it run a minute longer.
CODEX_WAIT_S = 1800
# Above the longest ask the MCP server allows (600 s), so the harness never cuts a tool off.
CODEX_TOOL_TIMEOUT_S = 660


def codex(agent: Agent, codex_home: Path) -> list[Change]:
    config = codex_home / "config.toml"
    before = read_text(config)
    try:
        doc = tomlkit.parse(before or "")
    except tomlkit.exceptions.ParseError as exc:
        raise UsageError(f"{config} is not valid TOML ({exc}); setup leaves it alone") from None
    servers = doc.get("mcp_servers")
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        doc["mcp_servers"] = servers
    entry = tomlkit.table()
    entry["command"] = agent.command[0]
    entry["args"] = [*agent.command[1:], *agent.mcp_args()]
    if agent.env:
        entry["env"] = agent.env
    entry["tool_timeout_sec"] = CODEX_TOOL_TIMEOUT_S
    servers[SERVER_KEY] = entry

    def hooks(data: dict[str, Any]) -> None:
        hook = {
            "type": "command",
            "command": agent.wait_command("codex-hook", CODEX_WAIT_S),
            "timeout": CODEX_WAIT_S + 60,
            "statusMessage": "waiting for crossintercom mail (Esc to stop)",
        }
        stop_hooks(data, "codex-hook", hook)

    return [
        Change(config, before, tomlkit.dumps(doc)),
        json_change(codex_home / "hooks.json", hooks),
    ]
