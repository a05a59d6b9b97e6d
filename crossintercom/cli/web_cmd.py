"""`crossintercom web`: the overseer page (docs/web.md)."""

from __future__ import annotations

import click

from crossintercom.cli.common import FiniteRange, json_option, settings
from crossintercom.cli.output import emit_json
from crossintercom.config import ENV_AS
from crossintercom.errors import UsageError

DEFAULT_AS = "overseer"
# A host whose lease lapsed a day ago is left out of the host list (docs/web.md, "Hosts").
DROP_HOSTS_AFTER_S = 86_400.0


@click.command()
@click.option(
    "--listen",
    default="127.0.0.1:8765",
    show_default=True,
    metavar="HOST:PORT",
    help="Where to serve; port 0 picks a free one. Anything but loopback exposes the page "
    "(token-protected, plain HTTP) to the network.",
)
@click.option(
    "--as",
    "as_name",
    default=DEFAULT_AS,
    show_default=True,
    envvar=ENV_AS,
    metavar="NAME",
    help="The human session the page sends, asks and replies as (durable, on this host).",
)
@click.option(
    "--queued-after",
    type=FiniteRange(0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="List mail in the attention view once it has been queued this long.",
)
@click.option(
    "--drop-hosts-after",
    type=FiniteRange(0),
    default=DROP_HOSTS_AFTER_S,
    show_default=True,
    metavar="SECONDS",
    help="Leave a host out of the host list once its lease has lapsed this long.",
)
@json_option
def web(
    listen: str, as_name: str, queued_after: float, drop_hosts_after: float, as_json: bool
) -> None:
    """Serve a local page for a human overseer: hosts, sessions, live messages, threads,
    receipts, search and compose. Every request needs the token printed at start."""
    try:
        from crossintercom.web.serve import run_web
    except ImportError as exc:
        raise UsageError(
            f"the web page needs the web extra: pip install 'crossintercom[web]' ({exc.name})"
        ) from None
    cfg = settings()

    def announce(info: dict[str, str]) -> None:
        if as_json:
            emit_json({"type": "web", **info})
            return
        click.echo(f"overseer page for {info['as']}: {info['url']}")
        click.echo(f"  the token is also in {info['token_file']}; Ctrl-C stops", err=True)
        if info["loopback"] != "yes":
            click.echo("  warning: listening beyond loopback, over plain HTTP", err=True)

    run_web(cfg, listen, as_name, announce, queued_after=queued_after, drop_after=drop_hosts_after)


COMMANDS = (web,)
