"""OpenCode: ``mcp.crossintercom`` in ``DIR/opencode.json``; the plugin that starts a turn on
new mail in ``DIR/.opencode/plugins/crossintercom.js``, where ``DIR`` is the project directory
(docs/agents.md#opencode).
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
from crossintercom.errors import UsageError

# How long the plugin's `wait` child waits for mail before it is started again.
OPENCODE_WAIT_S = 3600
# How long one long poll of a gateway's /wait lasts: under the five minutes after which a
# fetch may give up on an answer whose head has not come.
OPENCODE_POLL_S = 240


def plugin_source(agent: Agent) -> str:
    wait_s = OPENCODE_POLL_S if agent.gateway else OPENCODE_WAIT_S
    return script_source("opencode_plugin.js", agent, wait_s)


def opencode(agent: Agent, project: Path) -> list[Change]:
    if (project / "opencode.jsonc").exists():
        raise UsageError(
            f"{project / 'opencode.jsonc'} may hold comments, which setup cannot keep; add the "
            "entry `crossintercom setup opencode --print` shows by hand"
        )

    def config(data: dict[str, Any]) -> None:
        data.setdefault("$schema", "https://opencode.ai/config.json")
        if agent.gateway:
            # The gateway's MCP over streamable HTTP; the token from the environment.
            table(data, "mcp")[SERVER_KEY] = {
                "type": "remote",
                "url": f"{agent.gateway.rstrip('/')}/mcp",
                "enabled": True,
                "oauth": False,
                "headers": {"Authorization": f"Bearer {{env:{TOKEN_ENV}}}"},
            }
            return
        table(data, "mcp")[SERVER_KEY] = {
            "type": "local",
            "command": [*agent.command, *agent.mcp_args()],
            "enabled": True,
            "environment": agent.env,
        }

    plugin = project / ".opencode" / "plugins" / "crossintercom.js"
    return [
        json_change(project / "opencode.json", config),
        Change(plugin, read_text(plugin), plugin_source(agent)),
    ]
