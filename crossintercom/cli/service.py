"""broker, relay, demo, bench, chaos: the long-running and showcase commands."""

from __future__ import annotations

import click

from crossintercom.cli.common import json_option, settings
from crossintercom.local_broker.authority import DedupAuthority


@click.command()
@click.option(
    "--reset-authority",
    is_flag=True,
    help="Move unusable delivered-messages.sqlite/.key aside before starting.",
)
@click.pass_context
def broker(ctx: click.Context, reset_authority: bool) -> None:
    """Run the local broker in the foreground (clients normally start it themselves)."""
    from crossintercom.local_broker.run import run_broker
    from crossintercom.local_broker.spawn import can_connect
    from crossintercom.runtime import ensure_runtime_dir

    cfg = settings()
    ensure_runtime_dir(cfg)
    if reset_authority:
        if can_connect(cfg.socket_path):
            raise click.UsageError("a broker is running here; stop it before --reset-authority")
        for moved in DedupAuthority.reset(cfg.home):
            click.echo(f"moved aside: {moved}", err=True)
    run_broker(cfg, verbose=bool(ctx.find_root().obj.get("verbose")))


@click.command()
@json_option
def demo(as_json: bool) -> None:
    """Two sessions exchange send / ask / reply and print what happened."""
    from crossintercom.demo import run_demo

    run_demo(as_json=as_json)


COMMANDS = (broker, demo)
