"""listen, send, ask, reply, pending, inbox."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from crossintercom.agents.answered import answered, check_one_line
from crossintercom.agents.lifetime import lifeline
from crossintercom.agents.session import by_priority, show_lock
from crossintercom.cli import inbox_cmd
from crossintercom.cli.common import (
    FiniteRange,
    as_options,
    identity,
    json_option,
    one_shot,
    read_stdin_text,
    settings,
)
from crossintercom.cli.inbox_cmd import seen_notice, show_ids
from crossintercom.cli.marks import mark_options
from crossintercom.cli.output import emit_json, format_message, result_exit
from crossintercom.client import (
    MAX_ASK_TIMEOUT_S,
    AsyncClient,
    Identity,
    Marks,
    load_attachment,
    report_shown,
)
from crossintercom.client.acks import acknowledge_answered
from crossintercom.config import Settings
from crossintercom.inbox import Entry, Inbox
from crossintercom.inbox_faults import steady_call
from crossintercom.models import Attachment
from crossintercom.runtime import ensure_runtime_dir

SUBJECT_HELP = (
    "A one-line subject for the conversation (replies keep it); a line break in it is refused: "
    "error code not_one_line, exit 2."
)
THREAD_HELP = "Continue the thread with this id (a root message's id) instead of starting one."


def _one_line(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        check_one_line("subject", value)
    return value


def _thread_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--thread", "thread_id", metavar="ID", help=THREAD_HELP)(fn)
    return click.option("--subject", metavar="TEXT", help=SUBJECT_HELP, callback=_one_line)(fn)


ATTACH_HELP = (
    "Attach a UTF-8 text file. One over the message size limit is refused before anything is "
    "sent: error code too_large, exit 2."
)


def _outgoing(
    message: str | None, attach: tuple[str, ...]
) -> tuple[Settings, str, list[Attachment]]:
    """Settings, text and attachments of a send/ask/reply, checked before anything is sent."""
    cfg = settings()
    return cfg, _message_arg(message), _attachments(attach, cfg.max_message_bytes)


def _attachments(paths: tuple[str, ...], limit: int) -> list[Attachment]:
    return [load_attachment(p, limit) for p in paths]


def _message_arg(text: str | None) -> str:
    # Standard input only on an explicit '-': an agent's shell often leaves stdin open and
    # silent, and waiting on it would hang the command (docs/agents.md).
    if text is None:
        raise click.UsageError("give MESSAGE, or '-' to read it from standard input")
    if text == "-":
        text = read_stdin_text()
    if not text.strip():
        raise click.UsageError("the message is empty; nothing was sent")
    return text


@click.command()
@as_options(required=True)
@click.option("--fresh", is_flag=True, help="Do not print the backlog (it is still saved).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "line"]),
    help="json: as --json. line: one framed line per message for a model's line monitor; it "
    "attaches to the session the MCP server holds (docs/agents.md).",
)
@click.option(
    "--shown-receipts",
    is_flag=True,
    help="Also print `shown` receipts (another agent was shown a message NAME sent); they are "
    "saved in the inbox either way.",
)
@json_option
def listen(
    as_name: str,
    session_id: str | None,
    fresh: bool,
    fmt: str | None,
    shown_receipts: bool,
    as_json: bool,
) -> None:
    """Register NAME here (durable) and print each incoming message.

    A message is acknowledged once saved to the inbox and marked shown after it was printed.
    """
    cfg = settings()
    ensure_runtime_dir(cfg)
    ident = Identity.named(cfg, as_name, session_id)
    if fmt == "line" or os.environ.get(lifeline.ENV_HARNESS_PID):
        lifeline.install()  # a harness's monitor ends with its harness (docs/agents.md#lifeline)
    if fmt == "line":
        from crossintercom.agents.wake.monitor import run_line_monitor

        asyncio.run(run_line_monitor(cfg, ident))
        return
    as_json = as_json or fmt == "json"
    view = _View(as_json, skip_resumed=fresh, shown_receipts=shown_receipts)
    asyncio.run(_listen(cfg, ident, view, as_name=as_name, fresh=fresh))


# `shown` reports are gathered for this long (or this many): a sender's receipts then cost one
# queue transaction and one inbox commit per batch, not per message (docs/performance.md).
SHOWN_COALESCE_S = 0.1
SHOWN_BATCH = 256
DISPLAY_EVERY_S = 0.02


@dataclass(frozen=True, slots=True)
class _View:
    as_json: bool
    skip_resumed: bool
    shown_receipts: bool


async def _listen(
    cfg: Settings, ident: Identity, view: _View, *, as_name: str, fresh: bool
) -> None:
    """The client and the display on one event loop: the display reads and marks the inbox
    through the connection that saves into it, so neither waits on the other's file lock and
    no delivery wakes a second thread (docs/perf-log/2026-12.md, "Same-host path reshaped")."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncClient(cfg, ident, mode="own") as client:
        # A full or read-only inbox is waited out, never the end of the listener: each step on
        # the inbox is tried again until it works (docs/reliability.md).
        opened = await steady_call(lambda: client.inbox, stop.is_set)
        if opened is None:
            return
        display: Inbox = opened
        if fresh:  # skip printing what was already waiting; it stays in the inbox
            await steady_call(
                lambda: display.mark_shown([e.seq for e in display.unshown()]), stop.is_set
            )
        if not view.as_json:
            click.echo(
                f"listening as {as_name}@{cfg.host_id} (session {ident.id}); Ctrl-C to stop",
                err=True,
            )
        unreported: list[dict[str, Any]] = []
        due = shown_at = 0.0
        while not stop.is_set():
            # At most one display pass (and one commit of its marks) per DISPLAY_EVERY_S: a
            # lone message is shown at once, a stream in passes that each show several.
            await asyncio.sleep(max(0.0, shown_at + DISPLAY_EVERY_S - loop.time()))
            printed = await steady_call(
                lambda: _show_unshown(cfg, display, ident.id, view), stop.is_set
            )
            if printed is None:
                break
            shown_at = loop.time()
            if printed and not unreported:
                due = loop.time() + SHOWN_COALESCE_S
            unreported += printed
            if unreported and (loop.time() >= due or len(unreported) >= SHOWN_BATCH):
                await report_shown(client, unreported)
                unreported = []
            wait = min(0.5, max(0.0, due - loop.time())) if unreported else 0.5
            await client.next_incoming(timeout=wait)
            client.drain_incoming()  # all of it is in the inbox: one display pass shows it
        if unreported:
            await report_shown(client, unreported)


def _show_unshown(
    cfg: Settings, display: Inbox, session_id: str, view: _View
) -> list[dict[str, Any]]:
    """Print what was never shown; returns the messages printed (for their ``shown`` receipts)."""
    printed: list[dict[str, Any]] = []
    with show_lock(cfg, session_id):  # shown once across every surface (docs/agents.md)
        entries = by_priority(display.unshown())
        for entry in entries:
            skipped = (seen_notice(entry) and not view.shown_receipts) or (
                view.skip_resumed and "resumed" in entry.body.get("flags", ())
            )
            if not skipped:
                _print_entry(entry, view.as_json)
                if entry.kind == "message":
                    printed.append(entry.body)
        # One mark for the pass, only after its output was flushed (docs/delivery.md).
        display.mark_shown([e.seq for e in entries])
    return printed


def _print_entry(entry: Entry, as_json: bool) -> None:
    if as_json:
        emit_json(entry.body)
    else:
        click.echo(format_message(entry.body))
        sys.stdout.flush()


@click.command()
@as_options(required=False)
@click.option(
    "--to",
    "target",
    required=True,
    metavar="TARGET",
    help="Session id, NAME, NAME@HOSTID or group:NAME.",
)
@click.option("--attach", "attach", multiple=True, metavar="PATH", help=ATTACH_HELP)
@_thread_options
@mark_options
@json_option
@click.argument("message", required=False)
def send(
    as_name: str | None,
    session_id: str | None,
    target: str,
    attach: tuple[str, ...],
    subject: str | None,
    thread_id: str | None,
    marks: Marks,
    as_json: bool,
    message: str | None,
) -> None:
    """Send MESSAGE to TARGET without waiting for an answer ('-' reads standard input)."""
    cfg, text, files = _outgoing(message, attach)
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        result = client.send(target, text, files, subject=subject, thread_id=thread_id, **marks)
    result_exit(result, as_json)


@click.command()
@as_options(required=False)
@click.option(
    "--to", "target", required=True, metavar="TARGET", help="Session id, NAME or NAME@HOSTID."
)
@click.option(
    "--timeout",
    type=FiniteRange(0, MAX_ASK_TIMEOUT_S, min_open=True),
    default=MAX_ASK_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for the reply.",
)
@click.option("--attach", "attach", multiple=True, metavar="PATH", help=ATTACH_HELP)
@_thread_options
@mark_options
@json_option
@click.argument("message", required=False)
def ask(
    as_name: str | None,
    session_id: str | None,
    target: str,
    timeout: float,
    attach: tuple[str, ...],
    subject: str | None,
    thread_id: str | None,
    marks: Marks,
    as_json: bool,
    message: str | None,
) -> None:
    """Send MESSAGE to TARGET and wait for its reply (exit 6 when none comes in time)."""
    cfg, text, files = _outgoing(message, attach)
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        result = client.ask(
            target, text, files, timeout=timeout, subject=subject, thread_id=thread_id, **marks
        )
        if result.reply is not None:
            # Printed below: the replier gets its `shown` receipt (docs/agents.md).
            client.run(functools.partial(report_shown, bodies=[result.reply.to_dict()]))
    result_exit(result, as_json, with_reply=True)


@click.command()
@as_options(required=True)
@click.option("--reply-to", metavar="ID", help="The ask to answer (default: the oldest pending).")
@click.option("--attach", "attach", multiple=True, metavar="PATH", help=ATTACH_HELP)
@mark_options
@json_option
@click.argument("message", required=False)
def reply(
    as_name: str,
    session_id: str | None,
    reply_to: str | None,
    attach: tuple[str, ...],
    marks: Marks,
    as_json: bool,
    message: str | None,
) -> None:
    """Answer an ask that was delivered to NAME."""
    cfg, text, files = _outgoing(message, attach)
    ident = identity(cfg, as_name, session_id)
    with one_shot(cfg, ident) as client:
        result = client.reply(text, reply_to=reply_to, attachments=files, **marks)
        ask = answered(result, reply_to)
        if ask is not None:  # answered: no hook or monitor hands the ask over again
            show_ids(cfg, client, ident.id, [ask])
            client.run(functools.partial(_acknowledge_answered, ask_id=ask))
    result_exit(result, as_json)


async def _acknowledge_answered(client: AsyncClient, ask_id: str) -> bool:
    """A reply acknowledges its ask when the asker asked for that (docs/delivery.md)."""
    return acknowledge_answered(client, ask_id)


COMMANDS = (listen, send, ask, reply, *inbox_cmd.COMMANDS)
