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
@click.option(
    "--store",
    "store_url",
    envvar="CROSSINTERCOM_STORE",
    metavar="URL",
    help="postgresql://USER@HOST/DB or sqlite:///PATH (env CROSSINTERCOM_STORE).",
)
@click.option(
    "--polling-observer",
    is_flag=True,
    help="Watch SQLite doorbells by polling (network filesystems without inotify).",
)
def relay(store_url: str | None, polling_observer: bool) -> None:
    """Bridge this host's broker to the shared store (run it as a service)."""
    from crossintercom.config import load_settings
    from crossintercom.relay.service import run_relay

    cfg = load_settings(store_url=store_url)
    run_relay(cfg, polling_observer=polling_observer)


@click.command()
@json_option
def demo(as_json: bool) -> None:
    """Two sessions exchange send / ask / reply and print what happened."""
    from crossintercom.demo import run_demo

    run_demo(as_json=as_json)


COMMANDS = (broker, relay, demo)
