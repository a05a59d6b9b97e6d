"""Options and helpers shared by the commands."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from crossintercom.agents.mcp.profiles import PROFILES
from crossintercom.client import Client, Identity, file_text
from crossintercom.config import ENV_AS, ENV_JSON, Settings, load_settings

F = TypeVar("F", bound=Callable[..., Any])


def _remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # `crossintercom --json CMD` and `crossintercom CMD --json` mean the same thing.
    root = ctx.find_root()
    root.ensure_object(dict)
    value = bool(value or root.obj.get("json"))
    root.obj["json"] = value
    return value


def json_option(f: F) -> F:
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        envvar=ENV_JSON,
        callback=_remember_json,
        is_eager=True,
        help="Print machine-readable JSON on stdout.",
    )(f)


def as_options(required: bool) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        f = click.option(
            "--session-id",
            metavar="ID",
            help="Use this session id instead of the one derived from --as NAME.",
        )(f)
        return click.option(
            "--as",
            "as_name",
            metavar="NAME",
            envvar=ENV_AS,
            required=required,
            help="Act as the durable session NAME on this host (env CROSSINTERCOM_AS).",
        )(f)

    return decorate


def profile_option(f: F) -> F:
    """``--profile``: the MCP server's tool set (docs/agents.md#tool-profiles)."""
    return click.option(
        "--profile",
        type=click.Choice(list(PROFILES)),
        help="The MCP tools offered: core (default; supervisor with --supervisor), coord, "
        "supervisor or all; the others stay CLI commands (docs/agents.md#tool-profiles).",
    )(f)


def settings() -> Settings:
    return load_settings()


def identity(cfg: Settings, as_name: str | None, session_id: str | None) -> Identity:
    if as_name is None and session_id is not None:
        raise click.UsageError("--session-id needs --as NAME")
    if as_name is None:
        return Identity.ephemeral()
    return Identity.named(cfg, as_name, session_id)


def one_shot(cfg: Settings, ident: Identity | None) -> Client:
    """A short-lived client: attaches to the live session here if any (docs/architecture.md)."""
    return Client(cfg, ident, mode="auto", reconnect=False).connect()


def read_stdin_text() -> str:
    """Standard input (an explicit '-') as text, as a text stream reads it (universal
    newlines): bytes that are not UTF-8 are a usage error before anything is sent, never a
    traceback half-way through."""
    if sys.stdin is None:
        raise click.UsageError("'-' given but there is no standard input")
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream given by a caller (a test): already text
        return sys.stdin.read()
    try:
        return file_text(buffer.read())
    except UnicodeDecodeError as exc:
        raise click.UsageError(
            f"standard input is not UTF-8 text (byte {exc.start}); nothing was sent"
        ) from None


class FiniteRange(click.FloatRange):
    """A FloatRange that refuses "nan" (it passes every bound: a wait would never end)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number
