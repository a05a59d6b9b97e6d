"""Tool results of the MCP server: what the model reads, in every form a harness shows it.

Claude Code and Codex show the model ``structuredContent`` (as JSON) instead of the text blocks
when a result has it; OpenCode and Pi show the text blocks. So a result that carries mail
(``inbox``, ``pending``, an ``ask``'s reply, an escalation's answer) has no structured content:
its text is the framed rendering, the one form the frame holds in. Nor has a result that lists
what other sessions and hosts wrote of themselves or of our mail (``list_sessions``, ``groups``,
``receipts``, ``acks``, held mail in ``inbound_policy``): its text quotes or flattens each such
field, and JSON would show them to the model bare. The other results (outcomes, errors, our own
state) keep structured content, every string in it neutralised to one line. See
docs/agents.md#framing.

Errors and refusals carry a stable ``code`` (``invalid_argument``, ``unknown_tool``,
``broker_unavailable``, the broker's own codes ...) and say that nothing was done.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ParamSpec

import msgspec
from mcp.types import CallToolResult, TextContent

from crossintercom.agents.escalations.escalation import EscalationError
from crossintercom.agents.handover.framing import (
    NOTE_CHARS,
    describe_outcome,
    header_field,
    one_line,
    quoted,
    utf8_len,
)
from crossintercom.agents.handover.mail import HANDOVER_BYTES, render_mail
from crossintercom.codes import Code
from crossintercom.errors import BrokerUnavailable, CrossintercomError, Disconnected, RemoteError
from crossintercom.models import Outcome, SendResult, SessionInfo

P = ParamSpec("P")
# Outcomes where nothing was done: an error result, as for any other refusal.
_REFUSALS = (Outcome.REFUSED, Outcome.NOT_SENT)
# A string in structured content is at most this long (one line, neutralised).
_DATA_CHARS = 4000
# Why the broker is down names local paths and its log's last line: for an operator, not a model.
BROKER_DOWN = (
    "this host's crossintercom broker cannot be reached right now (`crossintercom status` says why)"
)


def safe(value: Any) -> Any:
    """``value`` with every string in it neutralised to one line (keys are ours)."""
    if isinstance(value, str):
        return one_line(value, _DATA_CHARS)
    if isinstance(value, Mapping):
        return {str(k): safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe(v) for v in value]
    return value


def ok(text: str, data: Mapping[str, Any] | None = None) -> CallToolResult:
    """A result; ``data`` becomes structured content with its strings neutralised."""
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=safe(dict(data)) if data is not None else None,
    )


def text_only(text: str) -> CallToolResult:
    """A result carrying mail, or fields other sessions and hosts wrote: the text only, where
    each is framed or quoted (see the module's docstring)."""
    return ok(text)


mail = text_only


def error(code: str, message: str, **extra: Any) -> CallToolResult:
    """A failed call: the text names the code, the data is the CLI's ``{"error": ...}``."""
    message = one_line(message, NOTE_CHARS)
    return CallToolResult(
        content=[TextContent(type="text", text=f"error ({one_line(code)}): {message}")],
        structured_content=safe({"error": {"code": code, "message": message, **extra}}),
        is_error=True,
    )


def guarded(
    fn: Callable[P, Awaitable[CallToolResult]],
) -> Callable[P, Awaitable[CallToolResult]]:
    """Turn a crossintercom error into an error result with its stable code."""

    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> CallToolResult:
        try:
            return await fn(*args, **kwargs)
        except EscalationError as exc:
            return error(exc.code, exc.message + "; nothing was sent")
        except (BrokerUnavailable, Disconnected):
            return error(Code.BROKER_UNAVAILABLE, BROKER_DOWN + "; nothing was done")
        except RemoteError as exc:
            if exc.code in (Code.BAD_FIELD, Code.MISSING_FIELD):
                # The broker's decoder names its own frame's fields: say it plainly instead.
                return error(exc.code, "the broker refused a value as malformed; nothing was done")
            return error(exc.code, exc.message)
        except CrossintercomError as exc:
            return error(exc.code, exc.message)

    return run


def _outcome_data(result: SendResult) -> dict[str, Any]:
    """The outcome as ``--json`` prints it (id, outcome, code, message, receipts)."""
    return result.to_dict()


def outcome(result: SendResult, what: str = "message") -> CallToolResult:
    """A send/reply outcome, honest about what it means (``unknown``: do not resend);
    a refusal (nothing was delivered or stored) is an error result with its code."""
    if result.code == Code.BROKER_UNAVAILABLE:
        result = msgspec.structs.replace(result, message=BROKER_DOWN)
    text = describe_outcome(result, what)
    if result.outcome in _REFUSALS:
        data = _outcome_data(result)
        return error(
            result.code or result.outcome.value, text, outcome=data["outcome"], id=result.id
        )
    return ok(text, _outcome_data(result))


def ask_text(
    result: SendResult, to: str, timeout: float, as_name: str, note: str | None = None
) -> str:
    """An ask's outcome and its reply (framed, with ``note`` inside the reply's frame), or
    plainly that the reply will come to the inbox."""
    text = describe_outcome(result, "ask")
    if result.reply is not None:
        reply = result.reply.to_dict()
        notes = {str(reply["id"]): note} if note else None
        text += "\nThe reply:\n"
        # The reply is one hand-over with this outcome (docs/agents.md#one-hand-over).
        text += render_mail([reply], as_name, notes, HANDOVER_BYTES - utf8_len(text))
    elif result.outcome in (Outcome.DELIVERED, Outcome.QUEUED):
        text += (
            f"\nNo reply yet from {one_line(to)} within {timeout:g} s. The ask stays open: "
            "the reply will arrive in your inbox (the inbox tool shows it, flagged late). "
            "Do not ask again; carry on and check the inbox later."
        )
    return text


def ask_outcome(
    result: SendResult, to: str, timeout: float, as_name: str, note: str | None = None
) -> CallToolResult:
    """An ask's result: with a reply it carries mail (text only); without, an outcome."""
    if result.outcome in _REFUSALS:
        return outcome(result, "ask")
    text = ask_text(result, to, timeout, as_name, note)
    if result.reply is not None:
        return mail(text)
    return ok(text, _outcome_data(result) | {"reply": None})


def sessions(found: Sequence[SessionInfo], note: str) -> CallToolResult:
    lines = [note] if note else []
    for s in found:
        state = "online" if s.online else "offline"
        groups = ",".join(header_field(g) for g in s.groups)
        where = f"{header_field(s.display_name)}@{header_field(s.host)}"
        line = (
            f"- {where} ({state}; wake {s.wake}; groups {groups or '-'}; id {header_field(s.id)})"
        )
        # What the session said of itself, each quoted: none can close another or pose as ours.
        if s.cwd:
            line += f"; cwd {quoted(s.cwd)}"
        if s.model:
            line += f"; model {quoted(s.model)}"
        if s.status:
            line += f"; status, in its own words: {quoted(s.status)}"
        lines.append(line)
    if not found:
        lines.append("No sessions match.")
    return text_only("\n".join(lines))
