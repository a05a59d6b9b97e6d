"""Asks the model has seen or answered count as shown, and the checks on what a tool sends.

An ask listed by ``pending`` or answered with ``reply`` was shown to the model: it is marked
shown in the inbox (and its sender gets the ``shown`` receipt), so no hook, monitor or ``wait``
hands it over again as waiting for an answer (docs/agents.md#shown-once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from crossintercom.agents.session import AgentSession, show_lock
from crossintercom.client.acks import acknowledge_answered
from crossintercom.errors import BrokerUnavailable, NotOneLine, UsageError
from crossintercom.inbox import Entry, Inbox
from crossintercom.models import Outcome, SendResult
from crossintercom.safetext import is_one_line

# A reply with one of these outcomes answered its ask (the broker reopens it otherwise).
_ANSWERED = (Outcome.DELIVERED, Outcome.QUEUED, Outcome.SHOWN)


def mark_ids(box: Inbox, ids: Iterable[str]) -> list[Entry]:
    """Mark the held, never-shown messages with these ids shown; returns them.

    The caller holds the session's show lock."""
    fresh = [e for mid in dict.fromkeys(ids) if (e := box.message(mid)) and not e.shown]
    box.mark_shown([e.seq for e in fresh])
    return fresh


def show_by_id(session: AgentSession, ids: Iterable[str]) -> list[Entry]:
    """The messages with these ids were just shown to the model: mark them and report it."""
    with show_lock(session.settings, session.identity.id):
        fresh = mark_ids(session.inbox, ids)
    session.report_shown(fresh)
    return fresh


def answered(result: SendResult, reply_to: str | None = None) -> str | None:
    """The ask a reply's result answered, if it did (the broker names it; ``reply_to``, the
    id the reply was sent for, stands in for a result replayed without it)."""
    return (result.reply_to or reply_to) if result.outcome in _ANSWERED else None


def show_answered(session: AgentSession, result: SendResult, reply_to: str | None) -> None:
    """An ask answered with ``reply`` no longer waits to be shown."""
    ask = answered(result, reply_to)
    if ask is not None:
        show_by_id(session, [ask])
        with contextlib.suppress(BrokerUnavailable):  # `ack` can still be given by hand
            acknowledge_answered(session.client, ask)


def check_text(text: str, what: str = "message") -> None:
    """Refuse an empty or whitespace-only text, as the CLI does."""
    if not text.strip():
        raise UsageError(f"the {what} is empty; nothing was sent")


def check_one_line(what: str, value: str | None) -> None:
    """Refuse a line break or control character in a field documented as one line."""
    if value is not None and not is_one_line(value):
        raise NotOneLine(f"the {what} must be one line (no line breaks or control characters)")
