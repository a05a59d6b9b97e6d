"""ack and acks: acknowledgements (docs/delivery.md#acknowledgement)."""

from __future__ import annotations

import functools
from typing import Any

import click

from crossintercom.agents.answered import check_one_line
from crossintercom.cli.common import as_options, identity, json_option, one_shot, settings
from crossintercom.cli.output import emit_json, refused_exit, result_exit
from crossintercom.client import (
    AsyncClient,
    acknowledge,
    awaiting_mine,
    dead_letter_json,
    dead_letters,
    inbound_json,
    inbound_policy,
    resend,
    sent_awaiting,
    synced_inbox,
)
from crossintercom.errors import Code, RemoteError, UsageError
from crossintercom.safetext import terminal_line


def _age(seconds: float) -> str:
    s = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


@click.command("ack")
@as_options(required=True)
@click.option("--note", metavar="TEXT", help="One line for the sender (e.g. 'done, no reply').")
@json_option
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
def ack_cmd(
    as_name: str, session_id: str | None, note: str | None, as_json: bool, ids: tuple[str, ...]
) -> None:
    """Acknowledge messages in NAME's inbox: each sender gets an `acknowledged` receipt. A
    reply acknowledges its ask by itself."""
    check_one_line("note", note)
    cfg = settings()

    async def run(c: AsyncClient) -> list[str]:
        await synced_inbox(c)
        return acknowledge(c, ids, note)

    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        done = client.run(run)
    if as_json:
        emit_json({"acknowledged": done})
    else:
        for mid in done:
            click.echo(f"acknowledged {mid}")


@click.command("acks")
@as_options(required=True)
@click.option("--sent", is_flag=True, help="What NAME sent that awaits acknowledgement.")
@json_option
def acks_cmd(as_name: str, session_id: str | None, sent: bool, as_json: bool) -> None:
    """Messages awaiting acknowledgement, with ages: those NAME was asked to acknowledge, or
    (--sent) those NAME sent with --ack-required and what became of them. Overdue ones are
    marked; exit 0 either way."""
    cfg = settings()

    async def mine(c: AsyncClient) -> list[dict[str, Any]]:
        return awaiting_mine(await synced_inbox(c))

    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        rows: list[dict[str, Any]] = client.run(sent_awaiting if sent else mine)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"nothing awaits acknowledgement {'from others' if sent else 'by ' + as_name}")
    for r in rows:
        f = terminal_line
        if sent:
            state = (
                f"acknowledged by {f(r['acknowledged_by'])}"
                + (f": {f(r['note'])}" if r.get("note") else "")
                if r["acknowledged"]
                else ("OVERDUE" if r["overdue"] else "awaiting")
            )
            click.echo(f"{f(r['id'])} to {f(r['to'])}, {_age(r['age_s'])} ago: {state}")
        else:
            sender = r.get("from") or {}
            who = f"{f(sender.get('name') or sender.get('id'))}@{f(sender.get('host'))}"
            late = " OVERDUE" if r["overdue"] else ""
            click.echo(f"{f(r['id'])} from {who}, {_age(r['age_s'])} ago{late}")


@click.command("dead-letters")
@as_options(required=True)
@click.option("--all", "everyone", is_flag=True, help="Every session's of this host.")
@json_option
def dead_letters_cmd(as_name: str, session_id: str | None, everyone: bool, as_json: bool) -> None:
    """Messages NAME sent that never reached their recipient (refused, not sent, expired,
    forgotten), with the reason; kept on this host for the retention period."""
    cfg = settings()
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        found = client.run(functools.partial(dead_letters, everyone=everyone))
    rows = [dead_letter_json(d) for d in found]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no dead letters")
    f = terminal_line
    for r in rows:
        why = f(r["code"] or r["outcome"]) + (f": {f(r['reason'])}" if r["reason"] else "")
        again = f" (resent as {f(r['resent_as'])})" if r["resent_as"] else ""
        click.echo(f"{f(r['id'])} to {f(r['to'])}: {f(r['outcome'])} ({why}){again}")
        click.echo(f"  {f(r['message'])[:200]}")


@click.command("resend")
@as_options(required=True)
@click.option("--recipient", metavar="ID", help="Only to this recipient it missed.")
@json_option
@click.argument("message_id", metavar="ID")
def resend_cmd(
    as_name: str, session_id: str | None, recipient: str | None, as_json: bool, message_id: str
) -> None:
    """Send dead letter ID again: a new message in the old one's thread, with a send's
    outcome and exit code."""
    cfg = settings()
    try:
        with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
            run = functools.partial(resend, message_id=message_id, recipient=recipient)
            result = client.run(run)
    except RemoteError as exc:  # no such dead letter: refused, exit 3
        refused_exit(exc.code, exc.message, as_json)
    result_exit(result, as_json)


def _inbound_out(state: Any, as_json: bool, unholding: bool = False) -> None:
    out = inbound_json(state)
    if as_json:
        emit_json(out)
        return
    f = terminal_line
    for pattern, action in out["rules"].items():
        click.echo(f"{f(pattern)}: {f(action)}")
    if not out["rules"]:
        click.echo("no rules: every sender is accepted")
    if unholding:
        click.echo(f"released {out['released']}")
    for h in out["held"]:
        click.echo(f"held {f(h['id'])} from {f(h['from'])}: {f(h['message'])[:120]}")


def _policy(client: Any, **change: Any) -> Any:
    """The broker's answer to an inbound-policy change; a pattern it refuses is a usage
    error (exit 2), as a bad argument is everywhere else."""
    try:
        return client.run(functools.partial(inbound_policy, **change))
    except RemoteError as exc:
        if exc.code == Code.INVALID_ARGUMENT:
            raise UsageError(exc.message) from None
        raise


@click.command("inbound")
@as_options(required=True)
@click.option("--remove", "remove", metavar="PATTERN", help="Remove the rule for PATTERN.")
@json_option
@click.argument("pattern", required=False)
@click.argument("action", required=False, type=click.Choice(("accept", "hold", "refuse")))
def inbound_cmd(
    as_name: str,
    session_id: str | None,
    remove: str | None,
    as_json: bool,
    pattern: str | None,
    action: str | None,
) -> None:
    """NAME's inbound policy: with PATTERN ACTION, set a rule (PATTERN: NAME, NAME@HOST, *@HOST,
    group:NAME or *; ACTION: accept, hold or refuse, a group never accept: anyone may join one);
    then list the rules and held mail."""
    if (pattern is None) != (action is None) or (remove and pattern):
        raise click.UsageError("give PATTERN and ACTION together, or --remove PATTERN")
    cfg = settings()
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        state = _policy(client, pattern=remove or pattern, action=action)
    _inbound_out(state, as_json)


@click.command("release")
@as_options(required=True)
@click.option("--all", "everything", is_flag=True, help="Release all held mail.")
@json_option
@click.argument("ids", nargs=-1, metavar="ID...")
def unhold_cmd(
    as_name: str, session_id: str | None, everything: bool, as_json: bool, ids: tuple[str, ...]
) -> None:
    """Release mail NAME's inbound policy held: it is delivered (shown, and wakes) as mail
    that waited while NAME was away."""
    if not ids and not everything:
        raise click.UsageError("give IDs or --all")
    cfg = settings()
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        if ids:  # all or none, as `ack`: an id that is not held is a mistake worth saying
            held = {h.id for h in _policy(client).held}
            missing = [terminal_line(i) for i in ids if i not in held]
            if missing:
                raise UsageError(f"no held message {', '.join(missing)} for {as_name}")
        state = _policy(client, unhold=["*"] if everything else list(ids))
    _inbound_out(state, as_json, unholding=True)


COMMANDS = (ack_cmd, acks_cmd, dead_letters_cmd, resend_cmd, inbound_cmd, unhold_cmd)
