"""`crossintercom gateway serve|grant|revoke|list`: lend this host's broker to sessions elsewhere,
each bound to a token (docs/operations.md#gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from crossintercom.cli.common import json_option, profile_option, settings
from crossintercom.cli.output import emit_json
from crossintercom.errors import UsageError
from crossintercom.timeparse import parse_age

if TYPE_CHECKING:
    from crossintercom.gateway.server import Listen


@click.group()
def gateway() -> None:
    """Serve this host's broker over HTTPS to sessions without one, each acting as the name
    its token was granted for."""


@gateway.command()
@click.option(
    "--listen",
    default="127.0.0.1:8443",
    show_default=True,
    metavar="HOST:PORT",
    help="Where to serve; port 0 picks a free one.",
)
@click.option("--cert", "cert_file", metavar="FILE", help="TLS certificate chain (PEM).")
@click.option("--key", "key_file", metavar="FILE", help="Its private key (PEM).")
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the bound ports here once listening, one a line (--listen's first).",
)
@click.option(
    "--mcp",
    "with_mcp",
    is_flag=True,
    help="Also serve MCP over streamable HTTP at /mcp on --listen, with the same certificate "
    "and tokens (docs/agents.md#mcp-over-http).",
)
@click.option(
    "--mcp-listen",
    metavar="HOST:PORT",
    help="As --mcp, and serve the same on this address too (a port of its own for MCP).",
)
@profile_option
def serve(
    listen: str,
    cert_file: str | None,
    key_file: str | None,
    ready_file: Path | None,
    with_mcp: bool,
    mcp_listen: str | None,
    profile: str | None,
) -> None:
    """Serve until stopped. Without --cert only loopback clients are served (a TLS proxy on
    this machine); every other plain-HTTP client is refused (gateway_plain_http)."""
    try:
        from crossintercom.gateway.server import serve as run
    except ImportError as exc:
        raise UsageError(
            f"the gateway needs the web extra: pip install 'crossintercom[web]' ({exc.name})"
        ) from None

    if bool(cert_file) != bool(key_file):
        raise UsageError("--cert and --key go together")
    where = _listen("--listen", listen, cert_file, key_file)
    mcp = _listen("--mcp-listen", mcp_listen, cert_file, key_file) if mcp_listen else None
    # Who connected as whom, and every refusal by its code (never a token): the operator's log.
    logging.getLogger("crossintercom.gateway").setLevel(logging.INFO)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(settings(), where, ready_file, mcp, profile, with_mcp=with_mcp))


def _listen(option: str, value: str, cert: str | None, key: str | None) -> Listen:
    from crossintercom.gateway.server import Listen

    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"{option} must be HOST:PORT, not {value!r}")
    return Listen(host.strip("[]"), int(port), cert, key)


@gateway.command()
@click.option("--as", "as_name", required=True, metavar="NAME", help="The name it acts as.")
@click.option(
    "--expires", metavar="AGE", help="Lapses after this long: 30m, 12h, 7d, 2w (default: never)."
)
@json_option
def grant(as_name: str, expires: str | None, as_json: bool) -> None:
    """Issue a token acting as NAME on this host, shown this once (only its hash is kept)."""
    from crossintercom.gateway.tokens import Grants

    try:
        expires_s = parse_age(expires) if expires else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cfg = settings()
    made, token = Grants(cfg).grant(as_name, expires_s)
    if as_json:
        emit_json({**made.public(), "token": token, "host": cfg.host_id})
        return
    click.echo(f"grant {made.id}: {as_name}@{cfg.host_id}; the token, shown this once:")
    click.echo(token)
    click.echo(
        "Put it in a file of its own (mode 0600) on the remote machine and set there "
        f"CROSSINTERCOM_GATEWAY=https://THIS-HOST:PORT, CROSSINTERCOM_HOST_ID={cfg.host_id}, "
        "CROSSINTERCOM_GATEWAY_TOKEN_FILE=FILE (and CROSSINTERCOM_GATEWAY_CA=CA-FILE)."
    )


@gateway.command()
@click.argument("which", metavar="GRANT-ID|NAME")
@json_option
def revoke(which: str, as_json: bool) -> None:
    """Revoke a grant, or every live grant of a name; their connections end within seconds."""
    from crossintercom.gateway.tokens import Grants

    done = Grants(settings()).revoke(which)
    if as_json:
        emit_json([g.public() for g in done])
        return
    for g in done:
        click.echo(f"revoked {g.id} ({g.name})")


@gateway.command("list")
@json_option
def list_grants(as_json: bool) -> None:
    """Every grant: id, name, created, expires, revoked (never a token)."""
    from crossintercom.gateway.tokens import Grants

    rows = [g.public() for g in Grants(settings()).load()]
    if as_json:
        emit_json(rows)
        return
    now = time.time()
    for r in rows:
        state = (
            "revoked"
            if r["revoked"]
            else "expired"
            if r["expires"] and r["expires"] <= now
            else "live"
        )
        click.echo(f"{r['id']}  {r['name']}  {state}")
    if not rows:
        click.echo("No grants.")


COMMANDS = (gateway,)
