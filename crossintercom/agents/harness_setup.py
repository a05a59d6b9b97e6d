"""`crossintercom setup HARNESS`: the MCP server entry and the wake hook, where each harness
reads them, merged into the user's files without disturbing any other entry.

- claude-code: the MCP entry ``mcpServers.crossintercom`` in ``DIR/.mcp.json``; the Stop hook
  (``asyncRewake``) and ``enabledMcpjsonServers`` in ``DIR/.claude/settings.local.json``;
- codex: ``[mcp_servers.crossintercom]`` in ``DIR/config.toml``; the Stop hook in
  ``DIR/hooks.json``;
- opencode: ``mcp.crossintercom`` in ``DIR/opencode.json``; the plugin that starts a turn on new
  mail in ``DIR/.opencode/plugins/crossintercom.js``.

``DIR`` is the project directory for Claude Code and OpenCode (default: the current one) and
the Codex home for Codex (default ``$CODEX_HOME`` or ``~/.codex``). Running setup again replaces
crossintercom's own entries and nothing else (docs/agents.md#harness-recipes).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import tomlkit

from crossintercom.config import ENV_GROUP, ENV_HOME, ENV_HOST_ID
from crossintercom.errors import UsageError

HARNESSES = ("claude-code", "codex", "opencode")
SERVER_KEY = "crossintercom"
# The hook waits this long, and its harness lets it run a minute longer.
CLAUDE_WAIT_S = 3600
CODEX_WAIT_S = 1800
# Above the longest ask the MCP server allows (600 s), so the harness never cuts a tool off.
CODEX_TOOL_TIMEOUT_S = 660
# Only settings that are safe to inherit travel into harness configs; never the store URL,
# which may hold a password and is needed by relays only.
CARRIED_ENV = (ENV_HOME, ENV_HOST_ID, ENV_GROUP)


@dataclass(frozen=True, slots=True)
class Change:
    path: Path
    before: str | None
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after


def default_command() -> list[str]:
    """How a harness should start crossintercom: the installed script, by absolute path."""
    found = shutil.which("crossintercom")
    if found:
        return [str(Path(found).resolve())]
    return [sys.executable, "-m", "crossintercom.cli.main"]


def carried_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ) if environ is None else environ
    return {k: environ[k] for k in CARRIED_ENV if environ.get(k)}


@dataclass(frozen=True, slots=True)
class Agent:
    name: str
    supervisor: str | None
    command: list[str]
    env: dict[str, str]

    def mcp_args(self) -> list[str]:
        args = ["mcp", "--as", self.name]
        return [*args, "--supervisor", self.supervisor] if self.supervisor else args

    def shell(self, *args: str) -> str:
        """A hook command line (hooks run through a shell): env, then the command."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, *map(shlex.quote, [*self.command, *args])])

    def wait_command(self, fmt: str, timeout: int) -> str:
        return self.shell("wait", "--as", self.name, "--format", fmt, "--timeout", str(timeout))


def _is_ours(hook: Any, fmt: str) -> bool:
    command = hook.get("command", "") if isinstance(hook, dict) else ""
    return isinstance(command, str) and " wait " in command and f"--format {fmt}" in command


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _json_object(path: Path, text: str | None) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(
            f"{path} is not plain JSON ({exc}); setup leaves it alone. Add the entries "
            "`crossintercom setup ... --print` shows by hand"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} does not hold a JSON object; setup leaves it alone")
    return data


def _json_change(path: Path, edit: Callable[[dict[str, Any]], None]) -> Change:
    before = _read(path)
    data = _json_object(path, before)
    edit(data)
    return Change(path, before, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _stop_hooks(data: dict[str, Any], fmt: str, hook: dict[str, Any]) -> None:
    """Replace crossintercom's Stop hook in a Claude Code / Codex hooks object, keep the rest."""
    hooks = data.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise UsageError('"hooks" is not an object; setup leaves the file alone')
    groups = [g for g in hooks.get("Stop", []) if isinstance(g, dict)]
    kept = []
    for group in groups:
        inner = group.get("hooks", [])
        if isinstance(inner, list) and any(_is_ours(h, fmt) for h in inner):
            others = [h for h in inner if not _is_ours(h, fmt)]
            if others:
                kept.append({**group, "hooks": others})
        else:
            kept.append(group)
    hooks["Stop"] = [*kept, {"hooks": [hook]}]


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
        _stop_hooks(data, "claude-hook", hook)
        enabled = data.setdefault("enabledMcpjsonServers", [])
        if SERVER_KEY not in enabled:
            enabled.append(SERVER_KEY)

    return [
        _json_change(project / ".mcp.json", mcp),
        _json_change(project / ".claude" / "settings.local.json", settings),
    ]


def codex(agent: Agent, codex_home: Path) -> list[Change]:
    config = codex_home / "config.toml"
    before = _read(config)
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
        _stop_hooks(data, "codex-hook", hook)

    return [
        Change(config, before, tomlkit.dumps(doc)),
        _json_change(codex_home / "hooks.json", hooks),
    ]


def plugin_source(agent: Agent) -> str:
    template = resources.files("crossintercom.agents").joinpath("opencode_plugin.js").read_text()
    for key, value in (
        ("__COMMAND__", agent.command),
        ("__ENV__", agent.env),
        ("__NAME__", agent.name),
        ("__WAIT_S__", CLAUDE_WAIT_S),
    ):
        template = template.replace(key, json.dumps(value))
    return template


def opencode(agent: Agent, project: Path) -> list[Change]:
    if (project / "opencode.jsonc").exists():
        raise UsageError(
            f"{project / 'opencode.jsonc'} may hold comments, which setup cannot keep; add the "
            "entry `crossintercom setup opencode --print` shows by hand"
        )

    def config(data: dict[str, Any]) -> None:
        data.setdefault("$schema", "https://opencode.ai/config.json")
        servers = data.setdefault("mcp", {})
        servers[SERVER_KEY] = {
            "type": "local",
            "command": [*agent.command, *agent.mcp_args()],
            "enabled": True,
            "environment": agent.env,
        }

    plugin = project / ".opencode" / "plugins" / "crossintercom.js"
    return [
        _json_change(project / "opencode.json", config),
        Change(plugin, _read(plugin), plugin_source(agent)),
    ]


def plan(harness: str, agent: Agent, directory: Path) -> list[Change]:
    if harness == "claude-code":
        return claude_code(agent, directory)
    if harness == "codex":
        return codex(agent, directory)
    if harness == "opencode":
        return opencode(agent, directory)
    raise UsageError(f"unknown harness {harness!r}; one of {', '.join(HARNESSES)}")


def apply(changes: list[Change]) -> None:
    """Write each changed file whole (through a temporary file, so no reader sees half)."""
    for change in changes:
        if not change.changed:
            continue
        change.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = change.path.with_name(f".{change.path.name}.crossintercom-tmp")
        tmp.write_text(change.after)
        if change.path.exists():
            os.chmod(tmp, change.path.stat().st_mode & 0o7777)
        os.replace(tmp, change.path)
