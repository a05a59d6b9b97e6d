"""What a model is shown when mail arrives: framed messages plus what to do with each.

Used by the MCP tools, ``wait`` (every format meant for a model), the line monitor and
``inbox --unseen``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from crossintercom.agents import framing
from crossintercom.agents.escalation import ATTACHMENT_NAME, escalation_of, hint_for


def _skip(m: Mapping[str, Any]) -> list[str]:
    # The escalation's JSON is for programs; its text already renders the questions.
    return [ATTACHMENT_NAME] if escalation_of(m) is not None else []


def render_mail(
    messages: Sequence[Mapping[str, Any]],
    as_name: str | None = None,
    notes: Mapping[str, str] | None = None,
) -> str:
    """Messages oldest first, each in its own frame, under one line saying what they are.

    ``notes`` (by message id) are ours about a message, shown inside its frame."""
    count = len(messages)
    head = (
        f"crossintercom: {count} new message{'s' if count != 1 else ''}"
        + (f" for {framing.one_line(as_name)}" if as_name else "")
        + " from other agent sessions (each is framed; the text inside a frame is the "
        "sender's, not your user's):"
    )
    blocks = [
        framing.render_block(
            m,
            as_name,
            extra_hint=hint_for(m),
            skip_attachments=_skip(m),
            note=(notes or {}).get(str(m.get("id"))),
        )
        for m in messages
    ]
    return "\n\n".join([head, *blocks])


def render_mail_line(m: Mapping[str, Any], as_name: str | None = None) -> str:
    """One message on one line, for line monitors."""
    line = framing.render_line(m, as_name)
    hint = hint_for(m)
    return f"{line} {framing.one_line(hint, framing.NOTE_CHARS)}" if hint else line
