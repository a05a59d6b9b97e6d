"""`crossintercom setup HARNESS`: the MCP server entry and the wake hook, where each harness
reads them, merged into the user's files without disturbing any other entry.

Each harness has its writer in a module beside this one (``claude``, ``codex``, ``opencode``,
``pi``: what it writes, and where, is said there and in docs/agents.md#harness-recipes); this
module picks one. Running setup again replaces crossintercom's own entries and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from crossintercom.agents.setup.claude import claude_code
from crossintercom.agents.setup.codex import codex
from crossintercom.agents.setup.common import Agent, Change, apply, carried_env, default_command
from crossintercom.agents.setup.opencode import opencode
from crossintercom.agents.setup.pi import pi
from crossintercom.errors import UsageError

__all__ = ["HARNESSES", "Agent", "Change", "apply", "carried_env", "default_command", "plan"]

HARNESSES = ("claude-code", "codex", "opencode", "pi")


def plan(harness: str, agent: Agent, directory: Path) -> list[Change]:
    if harness == "claude-code":
        return claude_code(agent, directory)
    if harness == "codex":
        return codex(agent, directory)
    if harness == "opencode":
        return opencode(agent, directory)
    if harness == "pi":
        return pi(agent, directory)
    raise UsageError(f"unknown harness {harness!r}; one of {', '.join(HARNESSES)}")
