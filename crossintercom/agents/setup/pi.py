"""Pi: ``mcpServers.crossintercom`` in ``DIR/.pi/mcp.json``; the extension that wakes an idle
session on new mail in ``DIR/.pi/extensions/crossintercom.ts``, where ``DIR`` is the project
directory. Pi loads both once the project is trusted (docs/agents.md#pi).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossintercom.agents.setup.common import (
    SERVER_KEY,
    TOKEN_ENV,
    Agent,
    Change,
    json_change,
    read_text,
    script_source,
    table,
)

# How long the extension's `wait` child waits for mail before it is started again.
PI_WAIT_S = 3600
# How long one long poll of a gateway's /wait lasts: under the five minutes after which Node's
# fetch gives up on an answer whose head has not come.
PI_POLL_S = 240
# Above the longest ask the MCP server allows (600 s); Pi's own default is 60 s per request.
PI_TOOL_TIMEOUT_S = 660


def extension_source(agent: Agent) -> str:
    return script_source("pi_extension.ts", agent, PI_POLL_S if agent.gateway else PI_WAIT_S)


def pi(agent: Agent, project: Path) -> list[Change]:
    def config(data: dict[str, Any]) -> None:
        # The gateway's MCP over streamable HTTP, the token from the environment (Pi expands
        # `${NAME}` in a header); or crossintercom's stdio server run here.
        server: dict[str, Any] = (
            {
                "url": f"{agent.gateway.rstrip('/')}/mcp",
                "headers": {"Authorization": f"Bearer ${{{TOKEN_ENV}}}"},
            }
            if agent.gateway
            else {
                "command": agent.command[0],
                "args": [*agent.command[1:], *agent.mcp_args()],
                "env": agent.env,
            }
        )
        table(data, "mcpServers")[SERVER_KEY] = {
            **server,
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
