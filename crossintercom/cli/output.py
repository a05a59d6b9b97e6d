"""How commands print: JSON for scripts and agents, short lines and tables for people."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click

from crossintercom.agents.handover.mail import render_mail
from crossintercom.errors import CrossintercomError
from crossintercom.exits import EXIT_NO_REPLY, EXIT_OK, EXIT_REFUSED, OUTCOME_EXIT, result_exit_code
from crossintercom.models import Outcome, SendResult
from crossintercom.safetext import for_terminal, terminal_line


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def fail(exc: CrossintercomError, as_json: bool) -> NoReturn:
    """Print an error the documented way and exit with its code."""
    if as_json:
        emit_json(
            {
                "error": {
                    "code": exc.code,
                    "message": exc.message,
                    "outcome": exc.details.get("outcome"),
                    "id": exc.details.get("id"),
                }
            }
        )
    else:
        click.echo(f"error: {for_terminal(exc.message)}", err=True)
    sys.exit(exc.exit_code)


def refused_exit(code: str, message: str, as_json: bool) -> NoReturn:
    """A request the broker refused (not a message outcome): printed as an error, exit 3."""
    if as_json:
        emit_json({"error": {"code": code, "message": message, "outcome": None, "id": None}})
    else:
        click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_REFUSED)


def result_exit(result: SendResult, as_json: bool, *, with_reply: bool = False) -> NoReturn:
    """Print a send/ask/reply outcome and exit with the code its outcome maps to."""
    code = OUTCOME_EXIT[result.outcome]
    exit_code = result_exit_code(result, with_reply=with_reply)
    if as_json:
        if code == EXIT_OK:
            obj = result.to_dict()
            if with_reply:
                obj["reply"] = result.reply.to_dict() if result.reply else None
            emit_json(obj)
        else:
            err = {
                "code": result.code or result.outcome.value,
                "message": result.to_dict().get("message") or result.outcome.value,
                "outcome": result.outcome.value,
                "id": result.id,
            }
            if result.receipts is not None:
                err["receipts"] = [r.to_dict() for r in result.receipts]
            emit_json({"error": err})
    else:
        line = f"{result.outcome.value} {terminal_line(result.id)}"
        if result.code:
            line += f" ({terminal_line(result.code)})"
        click.echo(line, err=code != EXIT_OK)
        if result.message or result.outcome is Outcome.UNKNOWN:
            said = for_terminal(result.to_dict().get("message"))
            click.echo(f"  {said}", err=code != EXIT_OK)
        for r in result.receipts or ():
            click.echo(
                f"  {terminal_line(r.recipient)}: {r.outcome.value}"
                + (f" ({terminal_line(r.code)})" if r.code else "")
            )
        if with_reply and result.reply is not None:
            # An agent in a shell reads it: framed as the MCP ask tool shows it (docs/agents.md).
            click.echo(render_mail([result.reply.to_dict()]))
    if exit_code == EXIT_NO_REPLY and not as_json:
        click.echo("no reply before the timeout", err=True)
    sys.exit(exit_code)


def in_thread(m: dict[str, Any], thread_id: str) -> bool:
    """A saved message belongs to ``thread_id`` (one saved before threads is its own root)."""
    return (
        m.get("type", "message") == "message" and (m.get("thread_id") or m.get("id")) == thread_id
    )


def format_message(m: dict[str, Any]) -> str:
    """One message for a person's terminal: header line, text, attachments, how to answer.

    Every field came from another session or host: escape sequences and controls are dropped,
    header fields kept to one line (docs/agents.md#framing)."""
    f = terminal_line
    if m.get("type") == "receipt":
        return (
            f"[receipt] {f(m.get('id'))}: {f(m.get('outcome'))}"
            + (f" for {f(m.get('recipient'))}" if m.get("recipient") else "")
            + (f" ({f(m.get('message'))})" if m.get("message") else "")
        )
    sender = m.get("from") or {}
    who = f"{f(sender.get('name') or sender.get('id'))}@{f(sender.get('host'))}"
    flags = f" [{f(', '.join(map(str, m['flags'])))}]" if m.get("flags") else ""
    head = f"--- {f(m.get('sent_at'))} from {who}{flags} id={f(m.get('id'))}"
    if m.get("priority") not in (None, "normal"):
        head += f" priority={f(m['priority'])}"
    if m.get("reply_to"):
        head += f" reply_to={f(m['reply_to'])}"
    if m.get("thread_id") and m.get("thread_id") != m.get("id"):
        head += f" thread={f(m['thread_id'])}"
    lines = [head]
    if m.get("subject"):
        lines.append(f"Subject: {f(m['subject'])}")
    lines.append(for_terminal(m.get("message", "")))
    for a in m.get("attachments") or ():
        lines.append(
            f"  [{f(a.get('kind'))}: {f(a.get('name'))}, {len(a.get('content', ''))} chars]"
        )
    if m.get("expects_reply"):
        lines.append(f"  (expects a reply: crossintercom reply --reply-to {f(m.get('id'))} TEXT)")
    if m.get("ack_required"):
        by = f", by {f(m['ack_by'])}" if m.get("ack_by") else ""
        lines.append(f"  (acknowledgement asked{by}: crossintercom ack {f(m.get('id'))})")
    return "\n".join(lines)
