"""`crossintercom`: the command line (README). Keep names, JSON shapes and exit codes stable."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from crossintercom.cli import info, messaging, service
from crossintercom.cli.db import db
from crossintercom.cli.output import EXIT_ERROR, fail
from crossintercom.errors import CrossintercomError

F = TypeVar("F", bound=Callable[..., Any])

ENV_HELP = """
Environment (only settings that are safe to inherit): CROSSINTERCOM_HOME (runtime dir,
default ~/.crossintercom), CROSSINTERCOM_HOST_ID (default USER@HOSTNAME), CROSSINTERCOM_STORE
(postgresql://... or sqlite:///path), CROSSINTERCOM_GROUP (group-shared runtime dir),
CROSSINTERCOM_AS (--as), CROSSINTERCOM_JSON (--json).
"""


class Root(click.Group):
    """Turns crossintercom errors into one readable line (or JSON) and a stable exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CrossintercomError as exc:
            if ctx.obj and ctx.obj.get("verbose"):
                logging.getLogger(__name__).exception("command failed")
            fail(exc, _wants_json(ctx))
        except OSError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_ERROR)


def _wants_json(ctx: click.Context) -> bool:
    # Set by the --json option's callback, so errors raised later still print as JSON.
    return bool(ctx.obj and ctx.obj.get("json"))


@click.group(cls=Root, epilog=ENV_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show debug logs and tracebacks.")
@click.version_option(package_name="crossintercom")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Mailbox for agent sessions and programs on one or several machines."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


for command in (*messaging.COMMANDS, *info.COMMANDS, *service.COMMANDS, db):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="crossintercom")


if __name__ == "__main__":
    main()
