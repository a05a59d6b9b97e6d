"""What every harness's set-up shares: the agent to set up, the planned file changes, and
merging crossintercom's own entries into a user's files without disturbing any other entry
(docs/agents.md#harness-recipes). Each harness's own writer lives in ``setup_HARNESS.py``;
``harness_setup`` picks one.
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

from crossintercom.config import ENV_GROUP, ENV_HOME, ENV_HOST_ID
from crossintercom.errors import UsageError

SERVER_KEY = "crossintercom"
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
    # Let the harness run the server's tools without asking, where it has such a rule.
    allow_tools: bool = True

    def mcp_args(self) -> list[str]:
        args = ["mcp", "--as", self.name]
        return [*args, "--supervisor", self.supervisor] if self.supervisor else args

    def shell(self, *args: str) -> str:
        """A hook command line (hooks run through a shell): env, then the command."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, *map(shlex.quote, [*self.command, *args])])

    def wait_command(self, fmt: str, timeout: int) -> str:
        return self.shell("wait", "--as", self.name, "--format", fmt, "--timeout", str(timeout))


def script_source(template: str, agent: Agent, wait_s: int) -> str:
    """A harness plugin shipped in this package (``template``), its placeholders filled in as
    JavaScript literals: how to start crossintercom, the env it carries, the name, the wait."""
    text = resources.files("crossintercom.agents").joinpath(template).read_text()
    for key, value in (
        ("__COMMAND__", agent.command),
        ("__ENV__", agent.env),
        ("__NAME__", agent.name),
        ("__WAIT_S__", wait_s),
    ):
        text = text.replace(key, json.dumps(value))
    return text


def is_ours(hook: Any, fmt: str) -> bool:
    command = hook.get("command", "") if isinstance(hook, dict) else ""
    return isinstance(command, str) and " wait " in command and f"--format {fmt}" in command


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def json_object(path: Path, text: str | None) -> dict[str, Any]:
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


def json_change(path: Path, edit: Callable[[dict[str, Any]], None]) -> Change:
    before = read_text(path)
    data = json_object(path, before)
    edit(data)
    return Change(path, before, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def stop_hooks(data: dict[str, Any], fmt: str, hook: dict[str, Any], event: str = "Stop") -> None:
    """Replace crossintercom's hook for ``event`` (Stop, SessionStart) in a Claude Code / Codex
    hooks object, keep the rest."""
    hooks = data.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise UsageError('"hooks" is not an object; setup leaves the file alone')
    groups = [g for g in hooks.get(event, []) if isinstance(g, dict)]
    kept = []
    for group in groups:
        inner = group.get("hooks", [])
        if isinstance(inner, list) and any(is_ours(h, fmt) for h in inner):
            others = [h for h in inner if not is_ours(h, fmt)]
            if others:
                kept.append({**group, "hooks": others})
        else:
            kept.append(group)
    hooks[event] = [*kept, {"hooks": [hook]}]


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
