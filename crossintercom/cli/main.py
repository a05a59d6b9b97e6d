"""`crossintercom`: the command line (README). Keep names, JSON shapes and exit codes stable."""

from __future__ import annotations

import faulthandler
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

# First of ours: the lifeline notes the parent that started us before the slow imports below
# (docs/agents.md#lifeline).
from crossintercom.agents.lifetime import lifeline  # noqa: F401
from crossintercom.cli.output import fail
from crossintercom.config import ENV_JSON, ENV_LOG_FORMAT, LOG_FORMATS, load_settings
from crossintercom.errors import CrossintercomError, UsageError
from crossintercom.exits import EXIT_ERROR
from crossintercom.relay import logs

F = TypeVar("F", bound=Callable[..., Any])

ENV_HELP = """
Environment (only settings that are safe to inherit): CROSSINTERCOM_HOME (runtime dir,
default ~/.crossintercom), CROSSINTERCOM_HOST_ID (default USER@HOSTNAME), CROSSINTERCOM_STORE
(postgresql://... or sqlite:///path), CROSSINTERCOM_STORE_PASSWORD_FILE (a file holding the
store's password), CROSSINTERCOM_STORE_SSL_ROOT_CERT, CROSSINTERCOM_STORE_SSL_CERT and
CROSSINTERCOM_STORE_SSL_KEY (the store's TLS CA, client certificate and key),
CROSSINTERCOM_GROUP (group-shared runtime dir), CROSSINTERCOM_AS (--as), CROSSINTERCOM_JSON
(--json), CROSSINTERCOM_GATEWAY, CROSSINTERCOM_GATEWAY_TOKEN_FILE and CROSSINTERCOM_GATEWAY_CA
(a gateway instead of a local broker).
"""


# Each command's module, imported only when that command runs or help lists them all: a
# harness runs `wait` on every turn, and it should not pay for SQLAlchemy's and the web page's
# imports (docs/architecture.md, "Start-up"). tests/cli/test_lazy_commands.py keeps this
# table in step with each module's COMMANDS.
COMMAND_MODULES: dict[str, str] = {
    **dict.fromkeys(("listen", "send", "ask", "reply", "pending", "inbox"), "messaging"),
    **dict.fromkeys(("list", "status", "groups", "join", "leave"), "info"),
    **dict.fromkeys(("broker", "relay", "demo", "bench", "chaos"), "service"),
    **dict.fromkeys(("wait", "mcp", "set-status", "set-wake", "forget"), "agent_cmds"),
    "escalate": "escalate",
    "setup": "setup_cmd",
    **dict.fromkeys(("search", "archive"), "search"),
    "web": "web_cmd",
    "gateway": "gateway_cmd",
    **dict.fromkeys(("ack", "acks", "dead-letters", "resend", "inbound", "release"), "coord_cmds"),
    **dict.fromkeys(("reserve", "unreserve", "reservations"), "reserve_cmds"),
    "db": "db",
}


def load_command(name: str) -> click.Command:
    module = importlib.import_module(f"crossintercom.cli.{COMMAND_MODULES[name]}")
    found: list[object] = [*getattr(module, "COMMANDS", ()), getattr(module, name, None)]
    return next(c for c in found if isinstance(c, click.Command) and c.name == name)


class Root(click.Group):
    """Turns crossintercom errors into one readable line (or JSON) and a stable exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMAND_MODULES else None

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["raw_args"] = list(args)  # to honour --json when parsing itself fails
        try:
            _require_utf8(args)
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            _usage_fail(ctx, exc)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            _usage_fail(ctx, exc)
        except CrossintercomError as exc:
            if ctx.obj and ctx.obj.get("verbose"):
                logging.getLogger(__name__).exception("command failed")
            fail(exc, _wants_json(ctx))
        except OSError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_ERROR)


def _require_utf8(args: list[str]) -> None:
    """Bytes that are not UTF-8 (Python holds them as lone surrogates) cannot become a name, a
    message or a frame: refused before anything is done, not half-way through."""
    for n, arg in enumerate(args, 1):
        try:
            arg.encode()
        except UnicodeEncodeError:
            shown = os.fsencode(arg)[:80]
            raise click.UsageError(f"argument {n} is not UTF-8 text: {shown!r}") from None


def _wants_json(ctx: click.Context) -> bool:
    # Set by the --json option's callback, so errors raised later still print as JSON.
    return bool(ctx.obj and ctx.obj.get("json"))


def _usage_fail(ctx: click.Context, exc: click.UsageError) -> NoReturn:
    """Click's own usage errors follow the --json error contract too (exit 2)."""
    raw = ctx.meta.get("raw_args", [])
    before_dashes = raw[: raw.index("--")] if "--" in raw else raw
    env_json = os.environ.get(ENV_JSON, "").lower() in ("1", "true", "yes", "on")
    if _wants_json(ctx) or env_json or "--json" in before_dashes:
        fail(UsageError(exc.format_message()), as_json=True)
    raise exc


@click.group(cls=Root, epilog=ENV_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show debug logs and tracebacks.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    envvar=ENV_JSON,
    help="Print machine-readable JSON on stdout (as every command's own --json does).",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    help=f"Log lines as text or one JSON object each (env {ENV_LOG_FORMAT}; default text).",
)
@click.version_option(package_name="crossintercom")
@click.pass_context
def cli(ctx: click.Context, verbose: bool, as_json: bool, log_format: str | None) -> None:
    """Mailbox for agent sessions and programs on one or several machines."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    ctx.obj["json"] = as_json
    # Structured fields (a message id, the error) are part of what a line says, in either form.
    logs.configure(logging.DEBUG if verbose else logging.WARNING, log_format or _log_format())


def _log_format() -> str:
    """The log format the environment or config.json asks for; text when they cannot be read
    (the command itself then says why)."""
    try:
        return load_settings().log_format
    except CrossintercomError:
        return "text"


def main() -> None:
    faulthandler.enable()  # a fatal signal (SIGBUS, SIGSEGV) is reported on stderr
    cli(prog_name="crossintercom")


if __name__ == "__main__":
    main()
