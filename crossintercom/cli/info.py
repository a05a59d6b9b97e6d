"""list, status, groups, join, leave."""

from __future__ import annotations

from typing import Any

import click
import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from crossintercom.cli.common import as_options, identity, json_option, one_shot, settings
from crossintercom.cli.output import emit_json
from crossintercom.client import Client
from crossintercom.config import Settings
from crossintercom.errors import BrokerUnavailable, CrossintercomError, Disconnected, UsageError
from crossintercom.models import LISTED_SESSION_FIELDS, NAME_RULE, valid_name
from crossintercom.safetext import terminal_line
from crossintercom.storage.urls import mask_url


def _table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """Cells came from other sessions and hosts: one line each, no escape sequences, and
    plain text (``Text``), so rich reads no markup in them (docs/agents.md#framing)."""
    table = Table(title=title, title_justify="left")
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*(Text(terminal_line(cell)) for cell in r))
    Console().print(table)


@click.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """Sessions on every host; offline-but-known sessions are marked."""
    cfg = settings()
    with one_shot(cfg, None) as client:
        sessions = client.list_sessions()
    if as_json:
        emit_json([{k: s.to_dict()[k] for k in LISTED_SESSION_FIELDS} for s in sessions])
        return
    if not sessions:
        click.echo("no sessions")
        return
    _table(
        "sessions",
        ["name", "host", "state", "wake", "status", "groups", "id", "cwd"],
        [
            [
                s.display_name,
                s.host,
                "online" if s.online else "offline",
                s.wake,
                s.status or "",
                ",".join(s.groups),
                s.id,
                s.cwd or "",
            ]
            for s in sorted(sessions, key=lambda s: (s.host, s.display_name))
        ],
    )


def _replication(store_url: str, password_file: str | None) -> dict[str, Any]:
    """Whether the store replicates synchronously (asked of the store itself, briefly); its
    reason when it cannot be asked."""
    from crossintercom.storage.replication import replication
    from crossintercom.storage.urls import with_password_file

    try:
        return replication(with_password_file(store_url, password_file)).to_dict()
    except CrossintercomError as exc:
        return {"mode": "unknown", "says": exc.message}


def _fleet(cfg: Settings) -> dict[str, Any]:
    """Every host of the store, from the store alone (`status --all-hosts`): one opening, a
    hosts read (with what each host's relay wrote of itself: version, last error) and a
    queued-mail read. What a host wrote is its own words: checked when read
    (storage/rowcheck.py) and shown neutralised, in JSON too."""
    from crossintercom.storage import HostReport, migrate
    from crossintercom.storage.blocking import open_blocking_store
    from crossintercom.storage.urls import with_password_file

    if not cfg.store_url:
        raise UsageError("--all-hosts reads the store: set CROSSINTERCOM_STORE")
    url = with_password_file(cfg.store_url, cfg.store_password_file)
    with open_blocking_store(url) as bs:
        hosts = bs.run(bs.store.hosts(reports=True))
        queued = {m.host_id: m for m in bs.run(bs.store.queued_mail())}
    rows = []
    for h in hosts:
        waiting = queued.get(h.host_id)
        told = h.report or HostReport()
        rows.append(
            {
                "host_id": h.host_id,
                "generation": h.generation,
                "lease_age_s": h.beat_age_s,
                "queued": waiting.count if waiting else 0,
                "oldest_queued_age_s": waiting.oldest_age_s if waiting else None,
                "version": told.version,
                "last_error": None
                if told.error_code is None and told.error is None
                else {
                    "code": told.error_code,
                    "message": None if told.error is None else terminal_line(told.error),
                    "age_s": told.error_age_s,
                },
                "unreadable": list(told.unreadable),
            }
        )
    report: dict[str, Any] = {
        "store": mask_url(cfg.store_url),
        # open_store refuses any other revision, so every host that runs reads this one.
        "schema_revision": migrate.head_revision(),
        "hosts": rows,
    }
    if cfg.store_url.startswith("postgresql"):
        report["replication"] = _replication(cfg.store_url, cfg.store_password_file)
    return report


def _print_fleet(report: dict[str, Any]) -> None:
    click.echo(f"store:     {report['store']} (schema {report['schema_revision']})")
    if "replication" in report:
        rep = report["replication"]
        click.echo(f"replication: {rep['mode']}: {rep['says']}")

    def age(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f} s"

    def error(h: dict[str, Any]) -> str:
        e = h["last_error"]
        if e is None:
            return "-"
        return f"{e['code'] or '?'}: {e['message'] or '?'} ({age(e['age_s'])} ago)"

    _table(
        "hosts",
        ["host", "version", "generation", "lease age", "queued", "oldest queued", "last error"],
        [
            [
                h["host_id"],
                h["version"] or ("(unreadable)" if "version" in h["unreadable"] else "-"),
                str(h["generation"]),
                age(h["lease_age_s"]),
                str(h["queued"]),
                age(h["oldest_queued_age_s"]),
                error(h),
            ]
            for h in report["hosts"]
        ],
    )


@click.command()
@click.option(
    "--all-hosts",
    is_flag=True,
    help="Every host of the store, read from the store: version, lease age, mail queued for it "
    "and the oldest, its relay's last error, the schema revision and replication.",
)
@json_option
def status(all_hosts: bool, as_json: bool) -> None:
    """Broker, relay, store (password masked), host id and session count."""
    cfg = settings()
    if all_hosts:
        fleet = _fleet(cfg)
        if as_json:
            emit_json(fleet)
        else:
            _print_fleet(fleet)
        return
    report: dict[str, Any] = {
        "host_id": cfg.host_id,
        "home": str(cfg.home),
        "store": mask_url(cfg.store_url) if cfg.store_url else None,
    }
    try:
        client = Client(cfg, None, spawn=False, reconnect=False).connect()
    except (BrokerUnavailable, Disconnected):
        report |= {"broker": {"running": False}, "relay": {"connected": False}, "sessions": 0}
    else:
        with client:
            st = client.status()
        report |= {
            "broker": {
                "running": True,
                "pid": st.pid,
                "uptime_s": st.uptime_s,
                "queued": st.queued,
                "asks_waiting": st.asks_waiting,
                "dedup": msgspec.to_builtins(st.dedup),
            },
            "relay": msgspec.to_builtins(st.relay),
            "sessions": st.sessions,
            "remote_sessions": st.remote_sessions,
            "warnings": st.warnings,
            "inbound": st.inbound,
        }
    if cfg.store_url and cfg.store_url.startswith("postgresql"):
        report["replication"] = _replication(cfg.store_url, cfg.store_password_file)
    if as_json:
        emit_json(report)
        return
    broker = report["broker"]
    click.echo(f"host id:   {report['host_id']}")
    click.echo(f"runtime:   {report['home']}")
    click.echo(
        "broker:    "
        + (
            f"running (pid {broker['pid']}, {broker['queued']} queued)"
            if broker["running"]
            else "not running"
        )
    )
    relay = report["relay"]
    click.echo(
        "relay:     "
        + ("connected" if relay.get("connected") else "not connected")
        + (f" ({relay['store']})" if relay.get("store") else "")
    )
    click.echo(f"store:     {report['store'] or '(none configured)'}")
    click.echo(f"sessions:  {report['sessions']}")
    for name, pol in report.get("inbound", {}).items():
        rules = ", ".join(f"{p} {a}" for p, a in pol["rules"].items()) or "no rules"
        click.echo(f"inbound:   {name}: {rules}; {pol['held']} held")
    if "replication" in report:
        rep = report["replication"]
        click.echo(f"replication: {rep['mode']}: {rep['says']}")
    for warning in report.get("warnings", []):
        click.echo(f"warning:   {warning}")


@click.command()
@json_option
def groups(as_json: bool) -> None:
    """Groups and their members on every host."""
    cfg = settings()
    with one_shot(cfg, None) as client:
        found = client.groups()
    if as_json:
        emit_json(msgspec.to_builtins(found))
        return
    if not found:
        click.echo("no groups")
        return
    _table(
        "groups",
        ["group", "members"],
        [
            [
                g.name,
                ", ".join(
                    f"{m.name}@{m.host}" + ("" if m.online else " (offline)") for m in g.members
                ),
            ]
            for g in found
        ],
    )


def _group_name(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not valid_name(value):
        raise UsageError(f"invalid group name {terminal_line(repr(value))}: {NAME_RULE}")
    return value


def _membership(
    as_name: str, session_id: str | None, group: str, as_json: bool, joining: bool
) -> None:
    cfg = settings()
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        now = client.join(group) if joining else client.leave(group)
    if as_json:
        emit_json({"groups": now})
    else:
        click.echo(f"{as_name} is in: {', '.join(now) or '(no groups)'}")


@click.command()
@as_options(required=True)
@json_option
@click.argument("group", callback=_group_name)
def join(as_name: str, session_id: str | None, as_json: bool, group: str) -> None:
    """Add NAME to GROUP (kept for a durable session)."""
    _membership(as_name, session_id, group, as_json, joining=True)


@click.command()
@as_options(required=True)
@json_option
@click.argument("group", callback=_group_name)
def leave(as_name: str, session_id: str | None, as_json: bool, group: str) -> None:
    """Remove NAME from GROUP."""
    _membership(as_name, session_id, group, as_json, joining=False)


COMMANDS = (list_cmd, status, groups, join, leave)
