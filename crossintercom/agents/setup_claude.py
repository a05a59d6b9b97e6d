"""Claude Code: the MCP entry ``mcpServers.crossintercom`` in ``DIR/.mcp.json``; the Stop hook
(``asyncRewake``) and ``enabledMcpjsonServers`` in ``DIR/.claude/settings.local.json``, where
``DIR`` is the project directory (docs/agents.md#claude-code).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossintercom.agents.setup_common import SERVER_KEY, Agent, Change, json_change, stop_hooks

# The hook waits this long, and Claude Code lets it run a minute longer.
CLAUDE_WAIT_S = 3600


def claude_code(agent: Agent, project: Path) -> list[Change]:
    def mcp(data: dict[str, Any]) -> None:
        servers = data.setdefault("mcpServers", {})
        servers[SERVER_KEY] = {
            "type": "stdio",
            "command": agent.command[0],
            "args": [*agent.command[1:], *agent.mcp_args()],
            "env": agent.env,
        }

    def settings(data: dict[str, Any]) -> None:
        hook = {
            "type": "command",
            "command": agent.wait_command("claude-hook", CLAUDE_WAIT_S),
            "asyncRewake": True,
            "timeout": CLAUDE_WAIT_S + 60,
        }
        stop_hooks(data, "claude-hook", hook)
        enabled = data.setdefault("enabledMcpjsonServers", [])
        if SERVER_KEY not in enabled:
            enabled.append(SERVER_KEY)

    return [
        json_change(project / ".mcp.json", mcp),
        json_change(project / ".claude" / "settings.local.json", settings),
    ]
