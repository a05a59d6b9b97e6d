"""What needs the overseer's attention, from what the page already holds (docs/web.md,
"Needs attention"): asks waiting for an answer, escalations, mail queued too long, refusals and
expiries, lapsed hosts, sessions offline with mail waiting. Recomputed after every poll; the page
gets it whole (``attention`` events), each entry pointing at its message or thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

from crossintercom.models import FAILED, Outcome
from crossintercom.web.escalations import escalation_of

# Refusals and expiries are listed for this long after they happened.
RECENT_S: Final = 3600.0
# How many of the newest messages are looked at; older ones are history.
SCAN: Final = 5000
LIMIT: Final = 50  # entries of one kind at most


def _age(m: Mapping[str, Any], now: float) -> float | None:
    try:
        sent = datetime.fromisoformat(str(m.get("sent_at")).replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, now - sent.timestamp())


def _entry(kind: str, m: Mapping[str, Any], now: float, **extra: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "id": m["id"],
        "thread_id": m.get("thread_id") or m["id"],
        "from": m["from"],
        "to": m.get("to"),
        "subject": m.get("subject"),
        "message": m.get("message"),
        "sent_at": m.get("sent_at"),
        "age_s": _age(m, now),
        **extra,
    }


def attention(
    messages: Iterable[dict[str, Any]],
    roster: Mapping[str, Any],
    me: str,
    timeouts: Mapping[str, float],
    *,
    queued_after: float = 60.0,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Every entry, most urgent kinds first, oldest first within a kind. ``me``: the human
    session's id (what it may answer); ``timeouts``: the page's own asks' timeouts;
    ``queued_after``: how long mail is queued before it is listed (``web --queued-after``)."""
    now = time.time() if now is None else now
    items = list(messages)
    answered = {m.get("reply_to") for m in items if m.get("reply_to")}
    asks: list[dict[str, Any]] = []
    escalations: list[dict[str, Any]] = []
    queued: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    waiting_for: dict[str, int] = {}
    for m in items:
        rs = m.get("recipients") or []
        age = _age(m, now) or 0.0
        esc = escalation_of(m)
        closed = m["id"] in answered or any(r.get("outcome") in FAILED for r in rs)
        mine = any(r.get("session_id") == me for r in rs)
        if esc is not None and (esc["kind"] == "progress_update" or not closed):
            escalations.append(_entry("escalation", m, now, escalation=esc, answerable=mine))
        elif m.get("expects_reply") and not closed:
            wait = timeouts.get(m["id"])
            # Part of what the page is pushed again when it changes (unlike the age).
            overdue = wait is not None and age > wait
            asks.append(_entry("ask", m, now, timeout_s=wait, overdue=overdue, answerable=mine))
        for r in rs:
            outcome = r.get("outcome")
            if outcome == Outcome.QUEUED:
                sid = r.get("session_id") or ""
                waiting_for[sid] = waiting_for.get(sid, 0) + 1
                if age >= queued_after:
                    queued.append(_entry(Outcome.QUEUED, m, now, recipient=r))
            elif outcome in FAILED and age <= RECENT_S:
                failed.append(_entry(str(outcome), m, now, recipient=r, code=r.get("code")))
    out = [*escalations[-LIMIT:], *asks[-LIMIT:], *queued[-LIMIT:], *failed[-LIMIT:]]
    for h in roster.get("hosts") or ():
        if h.get("lease") == "lapsed":
            out.append({"kind": "lapsed", "host": h["host"], "heartbeat": h.get("heartbeat")})
    for s in roster.get("sessions") or ():
        if not s.get("online") and waiting_for.get(s.get("id") or ""):
            out.append(
                {
                    "kind": "offline",
                    "session": {"id": s["id"], "name": s.get("alias"), "host": s.get("host")},
                    "waiting": waiting_for[s["id"]],
                }
            )
    return out
