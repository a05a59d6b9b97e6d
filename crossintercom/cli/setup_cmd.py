"""`crossintercom setup claude-code|codex|opencode`: join a harness in one step."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import click

from crossintercom.agents.setup import harnesses as hs
from crossintercom.agents.setup.common import utf8
from crossintercom.cli.common import json_option, profile_option
from crossintercom.cli.output import emit_json
from crossintercom.config import ENV_AS
from crossintercom.errors import UsageError
from crossintercom.models import valid_name


def _default_dir(harness: str) -> Path:
    if harness == "codex":
        return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")
    return Path.cwd()


def _default_name() -> str:
    """The project directory's name, made a valid session name."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", Path.cwd().name).lstrip("._-")[:64]
    return name or "agent"


@click.command()
@click.argument("harness", type=click.Choice(hs.HARNESSES))
@click.option(
    "--as",
    "as_name",
    metavar="NAME",
    envvar=ENV_AS,
    help="The agent's session name (default: the current directory's name).",
)
@click.option("--supervisor", metavar="TARGET", help="Where the agent's escalations go.")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    help="Project directory (claude-code, opencode, pi; default: here) or Codex home (codex; "
    "default: $CODEX_HOME or ~/.codex).",
)
@click.option(
    "--command",
    "command",
    metavar="CMD",
    help="How the harness starts crossintercom (default: this installation's script).",
)
@click.option(
    "--allow/--no-allow",
    "allow_tools",
    default=True,
    help="claude-code: let the agent use crossintercom's tools without asking "
    "(permissions.allow mcp__crossintercom; default), or leave the rule out.",
)
@profile_option
@click.option(
    "--gateway",
    metavar="URL",
    help="Use a gateway's MCP over HTTP (https://HOST:PORT of "
    "its --mcp-listen), with the token in $CROSSINTERCOM_TOKEN, and a wake that long-polls "
    "the gateway (claude-code, codex: a curl hook; opencode, pi: fetch in the plugin); nothing of "
    "crossintercom runs here (docs/agents.md#mcp-over-http).",
)
@click.option("--gateway-ca", metavar="FILE", help="The CA file the gateway is checked against.")
@click.option(
    "--print", "print_only", is_flag=True, help="Show what would be written; write nothing."
)
@json_option
def setup(
    harness: str,
    as_name: str | None,
    supervisor: str | None,
    directory: Path | None,
    command: str | None,
    allow_tools: bool,
    profile: str | None,
    gateway: str | None,
    gateway_ca: str | None,
    print_only: bool,
    as_json: bool,
) -> None:
    """Write (or --print) the MCP server entry and the wake hook HARNESS reads, keeping every
    other entry in those files. Running it again changes nothing more (docs/agents.md)."""
    name = as_name or _default_name()
    if not valid_name(name):
        raise UsageError(f"invalid name {name!r}: use letters, digits, '.', '_' or '-'")
    argv = hs.default_command()
    if command:
        try:
            argv = shlex.split(utf8("--command", command))
        except ValueError as exc:
            raise UsageError(f"--command cannot be split as a shell would: {exc}") from None
        if not argv:
            raise UsageError("--command names no program")
    agent = hs.Agent(
        name=name,
        supervisor=utf8("--supervisor", supervisor) if supervisor else None,
        command=argv,
        env=hs.carried_env(),
        allow_tools=allow_tools,
        profile=profile,
        gateway=utf8("--gateway", gateway) if gateway else None,
        gateway_ca=utf8("--gateway-ca", gateway_ca) if gateway_ca else None,
    )
    if gateway and not gateway.startswith("https://"):
        raise UsageError("--gateway must be https://HOST:PORT (the token travels with it)")
    target = (directory or _default_dir(harness)).expanduser().absolute()
    changes = hs.plan(harness, agent, target)
    if not print_only:
        hs.apply(changes, target)
    if as_json:
        emit_json(
            {
                "harness": harness,
                "name": name,
                "written": not print_only,
                "files": [
                    {"path": str(c.path), "changed": c.changed, "content": c.after} for c in changes
                ],
            }
        )
        return
    for c in changes:
        if print_only:
            state = "would change" if c.changed else "unchanged"
            click.echo(f"# {c.path} ({state})")
            click.echo(c.after.rstrip("\n"))
            click.echo()
        else:
            click.echo(f"{'wrote' if c.changed else 'unchanged'}: {c.path}")
    if not print_only:
        click.echo(f"{harness} will run crossintercom as {name}; restart it to load the entries.")
        if harness == "codex" and any(c.changed and c.path.name == "hooks.json" for c in changes):
            # Codex skips a new or changed hook, silently, until a person trusts it.
            click.echo(
                "Codex runs the wake hook only once you trust it: start codex, open /hooks and "
                "trust the crossintercom Stop hook (again after each setup that changes it). "
                "Until then mail does not wake an idle session."
            )
        if harness == "pi":
            # Pi ignores a project's .pi/ files until the project is trusted (docs/agents.md#pi).
            click.echo(
                "Pi loads these files only in a trusted project: accept the trust question when "
                "the TUI asks (or /trust); one-shot and RPC runs (--print, --mode json|rpc) "
                "cannot ask and need --approve."
            )


COMMANDS = (setup,)
