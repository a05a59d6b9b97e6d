"""Pi: ``mcpServers.crossintercom`` in ``DIR/.pi/mcp.json``; the extension that wakes an idle
session on new mail in ``DIR/.pi/extensions/crossintercom.ts``, where ``DIR`` is the project
directory. Pi loads both once the project is trusted (docs/agents.md#pi).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossintercom.agents.setup.common import (
    SERVER_KEY,
    Agent,
    Change,
    json_change,
    read_text,
    script_source,
    table,
)

# How long the extension's `wait` child waits for mail before it is started again.
PI_WAIT_S = 3600
# Above the longest ask the MCP server allows (600 s); Pi's own default is 60 s per request.
PI_TOOL_TIMEOUT_S = 660


def extension_source(agent: Agent) -> str:
    return script_source("pi_extension.ts", agent, PI_WAIT_S)


def pi(agent: Agent, project: Path) -> list[Change]:
    def config(data: dict[str, Any]) -> None:
        table(data, "mcpServers")[SERVER_KEY] = {
            "command": agent.command[0],
            "args": [*agent.command[1:], *agent.mcp_args()],
            "env": agent.env,
            # Pi's default ("codemode") reaches a server's tools only from scripts; the agent
            # calls these directly, and Pi then waits for the server before the first prompt.
            "exposure": "direct",
            "timeout": PI_TOOL_TIMEOUT_S,
        }

    extension = project / ".pi" / "extensions" / "crossintercom.ts"
    return [
        json_change(project / ".pi" / "mcp.json", config),
        Change(extension, read_text(extension), extension_source(agent)),
    ]
