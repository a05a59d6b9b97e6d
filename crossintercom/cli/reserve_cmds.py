"""reserve, unreserve and reservations: path reservations per project across machines
(docs/agents.md#path-reservations), and the conflict check a pre-commit hook runs."""

from __future__ import annotations

import functools
import sys
from typing import Any, NoReturn

import click

from crossintercom import protocol as p
from crossintercom.cli.common import as_options, identity, json_option, one_shot, settings
from crossintercom.cli.output import emit_json
from crossintercom.client import (
    project_key,
    repo_paths,
    reservation_json,
    reservation_line,
    reservations,
    reserve,
    unreserve,
)
from crossintercom.client.reservations import held
from crossintercom.codes import Code
from crossintercom.exits import EXIT_REFUSED
from crossintercom.reservations import BadGlob, Mode, normalise, path_conflicts
from crossintercom.safetext import terminal_line
from crossintercom.timeparse import parse_age

PROJECT_HELP = (
    "The project key (the same on every machine). Default: this checkout's origin remote, "
    "normalised (ssh and https forms match), else its top directory's name."
)


def _project(f: Any) -> Any:
    return click.option("--project", metavar="KEY", help=PROJECT_HELP)(f)


def _ttl(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    try:
        seconds = parse_age(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not 0 < seconds <= 30 * 86400:
        raise click.BadParameter("a TTL is more than 0 and at most 30d")
    return seconds


def _show(items: list[p.Reservation]) -> None:
    for r in items:
        click.echo(terminal_line(reservation_line(r)))


def _clashed(state: p.ReservationList, as_json: bool) -> NoReturn:
    """A refused reserve: what it clashed with, exit 3."""
    message = state.message or "the reservation clashes with another session's"
    if as_json:
        error = {"code": state.code, "message": message, "outcome": None, "id": None}
        emit_json({"error": error, "conflicts": [reservation_json(r) for r in state.conflicts]})
    else:
        click.echo(f"error: {terminal_line(message)}", err=True)
    sys.exit(EXIT_REFUSED)


@click.command("reserve")
@as_options(required=True)
@_project
@click.option(
    "--exclusive/--shared",
    "exclusive",
    default=True,
    help="Exclusive (default): no other session may reserve an overlapping glob. Shared: "
    "others may share it, but none may hold it exclusively.",
)
@click.option("--ttl", default="1h", callback=_ttl, help="Lapses after AGE (30m, 4h, 2d).")
@click.option("--reason", metavar="TEXT", help="One line saying why, shown to other sessions.")
@json_option
@click.argument("globs", nargs=-1, required=True, metavar="GLOB...")
def reserve_cmd(
    as_name: str,
    session_id: str | None,
    project: str | None,
    exclusive: bool,
    ttl: int,
    reason: str | None,
    as_json: bool,
    globs: tuple[str, ...],
) -> None:
    """Reserve paths of this project for NAME (relative to the checkout's top: src/**,
    docs/*.md, lib/), all or none. Exit 3 and the clashing reservations when another
    session's clashes. Reserving a glob again renews it."""
    for glob in globs:  # a bad glob is a usage error (exit 2), found before any relay is asked
        try:
            normalise(glob)
        except BadGlob as exc:
            raise click.BadParameter(str(exc), param_hint="GLOB") from None
    cfg = settings()
    key = project_key(project)
    mode: Mode = "exclusive" if exclusive else "shared"
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        run = functools.partial(
            reserve, project=key, globs=globs, mode=mode, ttl_s=ttl, reason=reason
        )
        state = client.run(run)
    if state.code == Code.RESERVATION_CONFLICT:
        _clashed(state, as_json)
    if as_json:
        emit_json({"project": key, "reserved": [reservation_json(r) for r in state.items]})
        return
    click.echo(f"reserved in {terminal_line(key)}:")
    _show(state.items)


@click.command("unreserve")
@as_options(required=True)
@_project
@click.option("--all", "everything", is_flag=True, help="Every reservation NAME holds here.")
@json_option
@click.argument("globs", nargs=-1, metavar="GLOB...")
def unreserve_cmd(
    as_name: str,
    session_id: str | None,
    project: str | None,
    everything: bool,
    as_json: bool,
    globs: tuple[str, ...],
) -> None:
    """Release NAME's reservations of this project: the GLOBs given (as reserved), or --all."""
    if bool(globs) == everything:
        raise click.UsageError("give GLOBs or --all")
    cfg = settings()
    key = project_key(project)
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        run = functools.partial(unreserve, project=key, globs=list(globs) or None)
        state = client.run(run)
    if as_json:
        held_now = [reservation_json(r) for r in state.items]
        emit_json({"project": key, "released": state.released, "held": held_now})
        return
    click.echo(f"released {state.released}")
    _show(state.items)


@click.command("reservations")
@as_options(required=False)
@_project
@click.option("--all-projects", is_flag=True, help="Every project's reservations.")
@click.option(
    "--conflicts",
    is_flag=True,
    help="Check PATHs (relative to here): list other sessions' reservations a change to them "
    "clashes with, exit 3 when there is any (a pre-commit hook's check).",
)
@click.option(
    "--exclusive",
    is_flag=True,
    help="With --conflicts: check as an exclusive reservation would (shared ones clash too).",
)
@json_option
@click.argument("paths", nargs=-1, metavar="[PATH...]")
def reservations_cmd(
    as_name: str | None,
    session_id: str | None,
    project: str | None,
    all_projects: bool,
    conflicts: bool,
    exclusive: bool,
    as_json: bool,
    paths: tuple[str, ...],
) -> None:
    """Every host's live reservations of this project. With --conflicts PATH...: those of
    other sessions than --as NAME (all, without it) that a change to the PATHs clashes with;
    exit 3 when there is any, 0 when none."""
    if paths and not conflicts:
        raise click.UsageError("PATHs go with --conflicts")
    if all_projects and (conflicts or project):
        raise click.UsageError("--all-projects lists; it takes neither --project nor --conflicts")
    cfg = settings()
    key = None if all_projects else project_key(project)
    checked = repo_paths(paths) if conflicts else []
    ident = identity(cfg, as_name, session_id)
    with one_shot(cfg, ident) as client:
        state = client.run(functools.partial(reservations, project=key))
    me = ident.id if as_name is not None else None
    if state.more:
        # Bounded whatever the store holds (docs/protocol.md): the oldest were read, not all.
        click.echo(
            f"note: only the first {len(state.items)} reservations were read; the store holds "
            "more than one answer carries",
            err=True,
        )
    if not conflicts:
        if as_json:
            listed = [reservation_json(r) for r in state.items]
            emit_json({"project": key, "reservations": listed, "more": state.more})
            return
        if not state.items:
            click.echo("no reservations")
        for r in state.items:
            where = f"{r.project}: " if all_projects else ""
            click.echo(terminal_line(where + reservation_line(r)))
        return
    by_id = {r.id: r for r in state.items}
    mode: Mode = "exclusive" if exclusive else "shared"
    found = path_conflicts([held(r) for r in state.items], me, checked, mode)
    if as_json:
        rows = [{"path": path, **reservation_json(by_id[h.id])} for path, h in found]
        emit_json({"project": key, "conflicts": rows, "more": state.more})
    else:
        for path, h in found:
            line = f"{path}: {reservation_line(by_id[h.id])}"
            click.echo(terminal_line(line))
        if not found:
            click.echo(f"no conflicts in {terminal_line(key or '')}")
    sys.exit(EXIT_REFUSED if found else 0)


COMMANDS = (reserve_cmd, unreserve_cmd, reservations_cmd)
