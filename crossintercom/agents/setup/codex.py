"""Codex: ``[mcp_servers.crossintercom]`` in ``DIR/config.toml``; the Stop hook in
``DIR/hooks.json``, where ``DIR`` is the Codex home (docs/agents.md#codex).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit

from crossintercom.agents.setup.common import (
    CARRIED_ENV,
    SERVER_KEY,
    TOKEN_ENV,
    Agent,
    Change,
    json_change,
    read_text,
    stop_hooks,
)
from crossintercom.errors import UsageError

# The hook waits this long, and Codex lets it run a minute longer.
CODEX_WAIT_S = 1800
# The server's start (a Python interpreter and its imports) on a loaded machine, with margin.
CODEX_STARTUP_TIMEOUT_S = 30
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
    elif not isinstance(servers, dict):
        raise UsageError(f"{config}: mcp_servers is not a table; setup leaves it alone")
    entry = tomlkit.table()
    if agent.gateway:
        # The gateway's MCP over streamable HTTP; the token from the environment, by name.
        entry["url"] = f"{agent.gateway.rstrip('/')}/mcp"
        entry["bearer_token_env_var"] = TOKEN_ENV
    else:
        entry["command"] = agent.command[0]
        entry["args"] = [*agent.command[1:], *agent.mcp_args()]
        if agent.env:
            entry["env"] = agent.env
        # Codex gives an MCP server a short allow-list of its own environment: the settings
        # not fixed above are passed through by name, so a later `export` still reaches it.
        passed = [k for k in CARRIED_ENV if k not in agent.env]
        if passed:
            entry["env_vars"] = passed
    # Codex waits for a required server before the first turn (it otherwise starts without
    # its tools about one run in five) and fails loudly when it cannot start.
    entry["required"] = True
    entry["startup_timeout_sec"] = CODEX_STARTUP_TIMEOUT_S
    entry["tool_timeout_sec"] = CODEX_TOOL_TIMEOUT_S
    servers[SERVER_KEY] = entry

    def hooks(data: dict[str, Any]) -> None:
        hook = {
            "type": "command",
            "command": agent.curl_wait("codex-hook", CODEX_WAIT_S)
            if agent.gateway
            else agent.wait_command("codex-hook", CODEX_WAIT_S),
            "timeout": CODEX_WAIT_S + 60,
            "statusMessage": "waiting for crossintercom mail (Esc to stop)",
        }
        stop_hooks(data, "codex-hook", hook)

    return [
        Change(config, before, tomlkit.dumps(doc)),
        json_change(codex_home / "hooks.json", hooks),
    ]
