"""How commands print: JSON for scripts and agents, short lines and tables for people."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click

from crossintercom.errors import CrossintercomError
from crossintercom.models import Outcome, SendResult

# Exit codes (README "Exit codes"): scripts and agents branch on them.
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_NOT_SENT = 4
EXIT_UNKNOWN = 5
EXIT_NO_REPLY = 6

OUTCOME_EXIT = {
    Outcome.DELIVERED: EXIT_OK,
    Outcome.QUEUED: EXIT_OK,
    Outcome.REFUSED: EXIT_REFUSED,
    Outcome.NOT_SENT: EXIT_NOT_SENT,
    Outcome.UNKNOWN: EXIT_UNKNOWN,
    Outcome.EXPIRED: EXIT_REFUSED,
    Outcome.SHOWN: EXIT_OK,
}


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
        click.echo(f"error: {exc.message}", err=True)
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
        line = f"{result.outcome.value} {result.id}"
        if result.code:
            line += f" ({result.code})"
        click.echo(line, err=code != EXIT_OK)
        if result.message or result.outcome is Outcome.UNKNOWN:
            click.echo(f"  {result.to_dict().get('message')}", err=code != EXIT_OK)
        for r in result.receipts or ():
            click.echo(f"  {r.recipient}: {r.outcome.value}" + (f" ({r.code})" if r.code else ""))
        if with_reply and result.reply is not None:
            click.echo(format_message(result.reply.to_dict()))
    if with_reply and code == EXIT_OK and result.reply is None:
        if not as_json:
            click.echo("no reply before the timeout", err=True)
        sys.exit(EXIT_NO_REPLY)
    sys.exit(code)


def format_message(m: dict[str, Any]) -> str:
    """One message for a person: header line, text, attachments, how to answer."""
    if m.get("type") == "receipt":
        return (
            f"[receipt] {m.get('id')}: {m.get('outcome')}"
            + (f" for {m.get('recipient')}" if m.get("recipient") else "")
            + (f" ({m.get('message')})" if m.get("message") else "")
        )
    sender = m.get("from") or {}
    who = f"{sender.get('name') or sender.get('id')}@{sender.get('host')}"
    flags = f" [{', '.join(m['flags'])}]" if m.get("flags") else ""
    head = f"--- {m.get('sent_at')} from {who}{flags} id={m.get('id')}"
    if m.get("reply_to"):
        head += f" reply_to={m['reply_to']}"
    lines = [head, str(m.get("message", ""))]
    for a in m.get("attachments") or ():
        lines.append(f"  [{a.get('kind')}: {a.get('name')}, {len(a.get('content', ''))} chars]")
    if m.get("expects_reply"):
        lines.append(f"  (expects a reply: crossintercom reply --reply-to {m.get('id')} TEXT)")
    return "\n".join(lines)
