"""Tool results of the MCP server: readable text for the model plus the same facts as data.

Every result is a ``CallToolResult`` whose text is what the model reads and whose structured
content is the machine form (message objects and outcomes exactly as ``--json`` prints them).
Errors carry a stable ``code`` (``invalid_argument``, ``unknown_tool``, ``broker_unavailable``,
the broker's own codes ...) and say that nothing was done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mcp.types import CallToolResult, TextContent

from crossintercom.agents.framing import describe_outcome, neutralise
from crossintercom.agents.mail import render_mail
from crossintercom.models import LISTED_SESSION_FIELDS, Outcome, SendResult, SessionInfo


def ok(text: str, data: Mapping[str, Any]) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=dict(data)
    )


def error(code: str, message: str) -> CallToolResult:
    """A failed call: the text names the code, the data is the CLI's ``{"error": ...}``."""
    return CallToolResult(
        content=[TextContent(type="text", text=f"error ({code}): {message}")],
        structured_content={"error": {"code": code, "message": message}},
        is_error=True,
    )


def outcome(result: SendResult, what: str = "message") -> CallToolResult:
    """A send/reply outcome, honest about what it means (``unknown``: do not resend)."""
    return ok(describe_outcome(result, what), result.to_dict())


def ask_text(result: SendResult, to: str, timeout: float, as_name: str) -> str:
    """An ask's outcome and its reply, or plainly that the reply will come to the inbox."""
    text = describe_outcome(result, "ask")
    if result.reply is not None:
        text += "\nThe reply:\n" + render_mail([result.reply.to_dict()], as_name)
    elif result.outcome in (Outcome.DELIVERED, Outcome.QUEUED):
        text += (
            f"\nNo reply yet from {neutralise(to)} within {timeout:g} s. The ask stays open: "
            "the reply will arrive in your inbox (the inbox tool shows it, flagged late). "
            "Do not ask again; carry on and check the inbox later."
        )
    return text


def ask_outcome(result: SendResult, to: str, timeout: float, as_name: str) -> CallToolResult:
    data = result.to_dict() | {"reply": result.reply.to_dict() if result.reply else None}
    return ok(ask_text(result, to, timeout, as_name), data)


def sessions(found: Sequence[SessionInfo], note: str) -> CallToolResult:
    lines = [note] if note else []
    for s in found:
        state = "online" if s.online else "offline"
        status = f" — {neutralise(s.status)}" if s.status else ""
        groups = ",".join(s.groups)
        where = f"{neutralise(s.display_name)}@{neutralise(s.host)}"
        lines.append(f"- {where} ({state}; wake {s.wake}; groups {groups}){status}")
    if not found:
        lines.append("No sessions match.")
    listed = [{k: s.to_dict()[k] for k in LISTED_SESSION_FIELDS} for s in found]
    return ok("\n".join(lines), {"sessions": listed})


def messages(
    found: Sequence[Mapping[str, Any]], as_name: str, empty: str, extra: Mapping[str, Any]
) -> CallToolResult:
    text = render_mail(found, as_name) if found else empty
    return ok(text, {"messages": list(found), **extra})
