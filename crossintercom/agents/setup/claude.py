"""Claude Code: the MCP entry ``mcpServers.crossintercom`` in ``DIR/.mcp.json``; the Stop hook
(``asyncRewake``), the SessionStart hook that delivers through the messaging socket,
``enabledMcpjsonServers`` and the permission rule ``mcp__crossintercom``
(every tool of the server, unless ``--no-allow``) in ``DIR/.claude/settings.local.json``, where
``DIR`` is the project directory (docs/agents.md#claude-code).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossintercom.agents.setup.common import (
    SERVER_KEY,
    TOKEN_ENV,
    Agent,
    Change,
    array,
    json_change,
    stop_hooks,
    table,
)
from crossintercom.errors import UsageError

# Claude Code's rule for every tool of one MCP server (2.1.332 also takes `mcp__NAME__*`).
ALLOW_RULE = f"mcp__{SERVER_KEY}"
# The hook waits this long, and Claude Code lets it run a minute longer.
CLAUDE_WAIT_S = 3600


def claude_code(agent: Agent, project: Path) -> list[Change]:
    def mcp(data: dict[str, Any]) -> None:
        if agent.gateway:
            # The gateway's MCP over HTTP; the token from the environment (docs/agents.md).
            table(data, "mcpServers")[SERVER_KEY] = {
                "type": "http",
                "url": f"{agent.gateway.rstrip('/')}/mcp",
                "headers": {"Authorization": f"Bearer ${{{TOKEN_ENV}}}"},
            }
            return
        table(data, "mcpServers")[SERVER_KEY] = {
            "type": "stdio",
            "command": agent.command[0],
            "args": [*agent.command[1:], *agent.mcp_args()],
            "env": agent.env,
        }

    def settings(data: dict[str, Any]) -> None:
        wait = (
            agent.curl_wait("claude-hook", CLAUDE_WAIT_S)
            if agent.gateway
            else agent.wait_command("claude-hook", CLAUDE_WAIT_S)
        )
        hook = {
            "type": "command",
            "command": wait,
            "asyncRewake": True,
            "timeout": CLAUDE_WAIT_S + 60,
        }
        stop_hooks(data, "claude-hook", hook)
        if not agent.gateway:
            # Returns at once, leaving the delivery child behind (docs/agents.md#claude-code).
            start = {
                "type": "command",
                "command": agent.shell("wait", "--as", agent.name, "--format", "claude-socket"),
                "timeout": 30,
            }
            stop_hooks(data, "claude-socket", start, event="SessionStart")
        enabled = array(data, "enabledMcpjsonServers")
        if SERVER_KEY not in enabled:
            enabled.append(SERVER_KEY)
        permissions = table(data, "permissions")
        if not isinstance(permissions.get("allow", []), list):
            raise UsageError('"allow" is not a list; setup leaves the file alone')
        allow = [r for r in permissions.get("allow", []) if r != ALLOW_RULE]
        if agent.allow_tools:
            allow.append(ALLOW_RULE)
        if allow or "allow" in permissions:
            permissions["allow"] = allow
        if not permissions:
            del data["permissions"]

    return [
        json_change(project / ".mcp.json", mcp),
        json_change(project / ".claude" / "settings.local.json", settings),
    ]
