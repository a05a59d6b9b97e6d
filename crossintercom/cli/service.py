"""broker, relay, demo, bench, chaos: the long-running and showcase commands."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from crossintercom.cli.common import FiniteRange, json_option, settings
from crossintercom.cli.db import tls_options
from crossintercom.config import (
    ENV_LOG_FORMAT,
    ENV_METRICS,
    ENV_STORE,
    ENV_STORE_PASSWORD_FILE,
    LOG_FORMATS,
)
from crossintercom.local_broker.authority.dedup import DedupAuthority


@click.command()
@click.option(
    "--reset-authority",
    is_flag=True,
    help="Move unusable delivered-messages.sqlite/.key aside before starting.",
)
@click.pass_context
def broker(ctx: click.Context, reset_authority: bool) -> None:
    """Run the local broker in the foreground (clients normally start it themselves)."""
    from crossintercom.local_broker.process.run import run_broker
    from crossintercom.local_broker.process.spawn import can_connect
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
    envvar=ENV_STORE,
    metavar="URL",
    help=f"postgresql://USER@HOST/DB or sqlite:///PATH (env {ENV_STORE}).",
)
@click.option(
    "--store-password-file",
    "password_file",
    envvar=ENV_STORE_PASSWORD_FILE,
    metavar="PATH",
    help="Read the store's password from PATH (keeps it off the command line; "
    f"env {ENV_STORE_PASSWORD_FILE}). PGPASSWORD and ~/.pgpass work too.",
)
@tls_options
@click.option(
    "--polling-observer/--no-polling-observer",
    default=None,
    envvar="CROSSINTERCOM_POLLING_OBSERVER",
    help="Watch SQLite doorbells by polling, or with inotify; by default polling where the "
    "store's filesystem carries no change notifications across machines (NFS, SMB, FUSE).",
)
@click.option(
    "--require-sync-replication",
    "require_sync",
    is_flag=True,
    envvar="CROSSINTERCOM_REQUIRE_SYNC_REPLICATION",
    help="Run only while the PostgreSQL store replicates synchronously: refuse to start, or "
    "stop, otherwise, so nothing is acknowledged that a failover could lose.",
)
@click.option(
    "--metrics",
    metavar="ADDR:PORT",
    help=f"Serve Prometheus metrics on http://ADDR:PORT/metrics (env {ENV_METRICS}; ADDR "
    "defaults to 127.0.0.1; off unless set).",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    help=f"Log lines as text or one JSON object each (env {ENV_LOG_FORMAT}).",
)
@click.pass_context
def relay(
    ctx: click.Context,
    /,
    store_url: str | None,
    password_file: str | None,
    polling_observer: bool | None,
    require_sync: bool,
    metrics: str | None,
    log_format: str | None,
    **tls: str | None,
) -> None:
    """Bridge this host's broker to the shared store (run it as a service)."""
    from crossintercom.config import load_settings
    from crossintercom.relay import logs
    from crossintercom.relay.run import run_relay

    cfg = load_settings(
        None,
        store_url=store_url,
        store_password_file=password_file,
        metrics=metrics,
        log_format=log_format,
        **tls,
    )
    if log_format is not None:
        verbose = bool(ctx.find_root().obj.get("verbose"))
        logs.configure(logging.DEBUG if verbose else logging.WARNING, log_format)
    run_relay(cfg, polling_observer=polling_observer, require_sync=require_sync)


@click.command()
@json_option
def demo(as_json: bool) -> None:
    """Two simulated hosts over a temporary SQLite store exchange send / ask / reply."""
    from crossintercom.tools.demo import run_demo

    run_demo(as_json=as_json)


@click.command()
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    help="Benchmark the cross-host paths on this PostgreSQL store too (use a scratch "
    "database; it gets the schema if it has none); a temporary SQLite file is always measured.",
)
@click.option("--quick", is_flag=True, help="Small counts (CI): under a minute.")
@click.option(
    "--scale",
    is_flag=True,
    help="Also one broker with 1,000 sessions (200 with --quick) and, on PostgreSQL, 20 "
    "hosts on the one database (6 with --quick).",
)
@click.option(
    "--hosts",
    type=click.IntRange(2, 1000),
    metavar="N",
    help="With --scale on PostgreSQL: only N hosts on the one server, once (their idle commits, "
    "connections, memory, and every host delivering), bounded by N; e.g. --hosts 100 "
    "--own-postgres, a server at its defaults (docs/operations.md, Sizing).",
)
@click.option(
    "--chart",
    "chart",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    metavar="FILE.html",
    help="Also write the latency distributions and throughputs as a chart (HTML, no script).",
)
@click.option(
    "--own-postgres",
    is_flag=True,
    help="Measure PostgreSQL on a throwaway cluster (initdb + pg_ctl, own port) started with "
    "pg_stat_statements, so statements per message are counted; not with --store.",
)
@click.option(
    "--polling",
    is_flag=True,
    help="Also time cross-host SQLite one-way latency with the relays polling their doorbells "
    "(as on NFS, SMB or FUSE), beside the same path with inotify.",
)
@click.option(
    "--metrics",
    is_flag=True,
    help="The cross-host relays serve their Prometheus metrics, each read every second while "
    "they are measured (to compare with a run without).",
)
@json_option
def bench(
    store_url: str | None,
    quick: bool,
    scale: bool,
    chart: Path | None,
    own_postgres: bool,
    polling: bool,
    metrics: bool,
    as_json: bool,
    hosts: int | None = None,
) -> None:
    """Latency and throughput of every path, beside raw baselines measured in the same run."""
    import json

    from crossintercom.tools.bench import render, run_bench, write_chart

    if own_postgres and store_url is not None:
        raise click.UsageError("--own-postgres starts its own store; leave out --store")
    if hosts is not None and not scale:
        raise click.UsageError("--hosts goes with --scale")
    report = run_bench(
        store_url,
        quick=quick,
        scale=scale,
        own_postgres=own_postgres,
        polling=polling,
        hosts=hosts,
        metrics=metrics,
    )
    if chart is not None:
        write_chart(report, chart)
    if as_json:
        click.echo(json.dumps(report.to_dict()))
    else:
        render(report)
        if chart is not None:
            click.echo(f"  chart: {chart}")


@click.command()
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    help="Shared store for the simulated hosts (use a scratch database); default: a temporary "
    "SQLite file.",
)
@click.option("--hosts", type=click.IntRange(2, 16), default=3, show_default=True)
@click.option("--duration", type=FiniteRange(1, 3600), default=30.0, show_default=True, metavar="S")
@click.option("--seed", type=int, default=1, show_default=True, help="Seeds the fault schedule.")
@click.option(
    "--faults",
    metavar="KIND,...",
    help="Inject only these fault kinds (relay_kill, relay_pause, broker_kill, listener_kill, "
    "pg_terminate, pg_blackhole, pg_cut, pg_restart, hostile_rows, relay_takeover, "
    "inbox_readonly, disk_full); default: every kind the store allows and this machine can "
    "inject (inbox_readonly and disk_full need root). A kind asked for that cannot run here "
    "is reported with the reason and fails the run.",
)
@click.option(
    "--own-postgres",
    is_flag=True,
    help="Start a throwaway PostgreSQL cluster (initdb + pg_ctl in a temporary dir, own port) "
    "as the store, so the pg_restart fault can restart it; not with --store. With "
    "--faults pg_failover: a primary + streaming standby, the standby promoted under traffic.",
)
@click.option(
    "--async-replication",
    is_flag=True,
    help="pg_failover: the standby replicates asynchronously (the last commits before a "
    "failover can be lost: the run reports them); default synchronous.",
)
@json_option
def chaos(
    store_url: str | None,
    hosts: int,
    duration: float,
    seed: int,
    faults: str | None,
    own_postgres: bool,
    async_replication: bool,
    as_json: bool,
) -> None:
    """Simulated hosts under injected faults; exits 1 if anything acknowledged was lost or
    duplicated, or a hostile row was not quarantined."""
    import json

    from crossintercom.tools.chaos import render, run_chaos

    kinds = [k.strip() for k in faults.split(",") if k.strip()] if faults else None
    try:
        report = run_chaos(
            store_url,
            hosts=hosts,
            duration=duration,
            seed=seed,
            faults=kinds,
            own_postgres=own_postgres,
            synchronous=not async_replication,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report.to_dict()))
    else:
        render(report)
    raise SystemExit(0 if report.ok else 1)


COMMANDS = (broker, relay, demo, bench, chaos)
