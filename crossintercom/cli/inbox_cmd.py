"""pending and inbox: what waits for NAME and what NAME holds.

``pending``, ``inbox --unseen`` and ``inbox --message`` are surfaces an agent reads (docs/agents.md
lists them for CLI agents): they print framed mail, as the MCP tools do. The plain transcript is
for a person: terminal-safe, not framed (docs/agents.md#framing).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Iterable

import click

from crossintercom.agents.answered import mark_ids
from crossintercom.agents.handover.mail import asks_left, fit_mail, fit_page, fit_unseen
from crossintercom.agents.session import show_lock
from crossintercom.cli.common import as_options, identity, json_option, one_shot, settings
from crossintercom.cli.output import emit_json, format_message, in_thread
from crossintercom.client import Client, Identity, report_shown
from crossintercom.config import Settings
from crossintercom.errors import UsageError
from crossintercom.inbox import Entry, Inbox
from crossintercom.models import Outcome
from crossintercom.runtime import ensure_runtime_dir


def seen_notice(entry: Entry) -> bool:
    """A `shown` receipt: one per message sent would drown a stream or transcript, so the
    commands print them only when asked (docs/agents.md#shown-receipts)."""
    return entry.kind == "receipt" and entry.body.get("outcome") == Outcome.SHOWN


def show_ids(cfg: Settings, client: Client, session_id: str, ids: Iterable[str]) -> None:
    """These messages were just printed for NAME's agent: mark them shown, report it."""
    with show_lock(cfg, session_id):
        fresh = mark_ids(client.inbox, ids)
    if fresh:
        client.run(functools.partial(report_shown, bodies=[e.body for e in fresh]))


@click.command()
@as_options(required=True)
@json_option
def pending(as_name: str, session_id: str | None, as_json: bool) -> None:
    """Asks waiting for NAME's reply, oldest first (framed; they count as shown)."""
    cfg = settings()
    ident = identity(cfg, as_name, session_id)
    with one_shot(cfg, ident) as client:
        asks = [m.to_dict() for m in client.pending()]
        count = len(asks)
        if as_json:
            emit_json(asks)
        elif not asks:
            click.echo("no asks waiting for a reply")
        else:  # an agent reads it: one hand-over's budget (docs/agents.md#one-hand-over)
            text, count = fit_mail(asks, as_name, left=asks_left(as_name))
            click.echo(text)
        sys.stdout.flush()
        show_ids(cfg, client, ident.id, [str(m["id"]) for m in asks[:count]])


def _one_message(
    cfg: Settings, ident: Identity, as_name: str, mid: str, offset: int, attachment: str | None
) -> str:
    """One message of NAME's inbox (a page of its text, or of one attachment), framed."""
    box = Inbox.of(cfg, ident.id)
    try:
        entry = box.message(mid)
    finally:
        box.close()
    if entry is None:
        raise UsageError(f"no message with that id in {as_name}'s inbox")
    # An agent reads the page: within one hand-over's budget (docs/agents.md#one-hand-over).
    text = fit_page(entry.body, as_name, offset, attachment)
    if text is None:
        raise UsageError("that message has no attachment so named")
    return text


@click.command()
@as_options(required=True)
@click.option(
    "--unseen",
    is_flag=True,
    help="Pull in mail queued while NAME was away, print only messages never shown (framed, "
    "as an agent is shown them), and mark them shown.",
)
@click.option(
    "--shown-receipts",
    is_flag=True,
    help="Include the `shown` receipts for messages NAME sent (left out by default: one per "
    "message sent).",
)
@click.option("--thread", "thread_id", metavar="ID", help="Only the messages of this thread.")
@click.option("--message", "message_id", metavar="ID", help="Print this one message, framed.")
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=0,
    help="With --message: start at this character (the rest of a long message).",
)
@click.option("--attachment", metavar="NAME", help="With --message: print this attachment.")
@json_option
def inbox(
    as_name: str,
    session_id: str | None,
    unseen: bool,
    shown_receipts: bool,
    thread_id: str | None,
    message_id: str | None,
    offset: int,
    attachment: str | None,
    as_json: bool,
) -> None:
    """NAME's saved messages on this host, oldest first (a transcript)."""
    cfg = settings()
    ensure_runtime_dir(cfg)
    ident = Identity.named(cfg, as_name, session_id)
    if message_id is not None:
        click.echo(_one_message(cfg, ident, as_name, message_id, offset, attachment))
        return
    if unseen:
        _unseen(cfg, ident, as_name, as_json)
        return
    box = Inbox.of(cfg, ident.id)
    try:
        entries = [e for e in box.transcript() if shown_receipts or not seen_notice(e)]
    finally:
        box.close()
    if thread_id is not None:
        entries = [e for e in entries if in_thread(e.body, thread_id)]
    if as_json:
        emit_json([e.body for e in entries])
        return
    if not entries:
        click.echo(f"{as_name}'s inbox is empty")
    for e in entries:
        click.echo(format_message(e.body))


def _unseen(cfg: Settings, ident: Identity, as_name: str, as_json: bool) -> None:
    from crossintercom.agents.wake.monitor import show_unseen_once

    again = f"run `crossintercom inbox --as {as_name} --unseen` again to read them"

    def write(entries: list[Entry]) -> list[Entry]:
        # --json is for programs: every message whole. The framed text is for an agent: what
        # fits one hand-over, the rest stays unseen (docs/agents.md#one-hand-over).
        if as_json:
            emit_json([e.body for e in entries])
            shown = entries
        else:
            text, shown = fit_unseen(entries, as_name, again)
            click.echo(text)
        sys.stdout.flush()
        return shown

    if not asyncio.run(show_unseen_once(cfg, ident, write)):
        if as_json:
            emit_json([])
        else:
            click.echo(f"no unseen messages for {as_name}")


COMMANDS = (pending, inbox)
