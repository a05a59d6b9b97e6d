"""Search every inbox on this host: what a host without the archive can answer (docs/archive.md)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from crossintercom.errors import InboxUnavailable
from crossintercom.inbox import Inbox, session_ids
from crossintercom.models import Message
from crossintercom.search_model import MARK_END, MARK_START, SearchHit, SearchQuery, search_terms
from crossintercom.timeparse import parse_sent_at


def search_inboxes(directory: Path, host: str, query: SearchQuery) -> list[SearchHit]:
    """Search every inbox on this host: what a host without the archive can answer.

    Words match at the start of a word (``deploy`` finds ``deploying``), all of them must
    occur; the score is matches per length, like the archive's ranking in spirit only.
    """
    terms = search_terms(query.text)
    if not terms:
        return []
    hits: dict[str, SearchHit] = {}
    for sid in session_ids(directory):
        try:
            box = Inbox.view(directory, sid)
        except (sqlite3.Error, InboxUnavailable):
            continue
        try:
            for entry in box.messages():
                hit = _inbox_hit(entry.body, sid, host, terms, query)
                if hit is not None and hit.message.id not in hits:
                    hits[hit.message.id] = hit
        except (sqlite3.Error, InboxUnavailable):  # one unreadable inbox hides only its own
            continue
        finally:
            box.close()
    ranked = sorted(hits.values(), key=lambda h: (-h.score, h.message.sent_at), reverse=False)
    return ranked[: query.limit]


def _inbox_hit(
    body: dict[str, Any], session_id: str, host: str, terms: list[str], query: SearchQuery
) -> SearchHit | None:
    try:
        msg = Message.from_dict(body)
    except ValueError:
        return None
    if not _passes(msg, session_id, host, query):
        return None
    words = re.findall(r"\w+", f"{msg.subject or ''} {msg.text}".lower())
    counts = [sum(1 for w in words if w.startswith(t)) for t in terms]
    if not all(counts):
        return None
    score = sum(counts) / (1.0 + len(words) ** 0.5)
    return SearchHit(msg, round(score, 6), _snippet(msg.text, terms), "inbox")


def _passes(msg: Message, session_id: str, host: str, query: SearchQuery) -> bool:
    who = msg.sender
    if query.sender is not None and query.sender not in (
        who.id,
        who.name,
        f"{who.name or who.id}@{who.host}",
    ):
        return False
    if query.recipient is not None and query.recipient not in (msg.to, session_id):
        return False
    if query.host is not None and query.host not in (who.host, host):
        return False
    if query.thread is not None and msg.thread != query.thread:
        return False
    return query.since is None or parse_sent_at(msg.sent_at) >= query.since


def _snippet(text: str, terms: list[str], width: int = 160) -> str:
    """About ``width`` characters around the first match, matched words marked."""
    first = min(
        (m.start() for t in terms for m in re.finditer(rf"\b{re.escape(t)}", text, re.I)),
        default=0,
    )
    start = max(0, first - width // 3)
    piece = text[start : start + width]
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(t) for t in terms) + r")\w*", re.I)
    marked = pattern.sub(lambda m: f"{MARK_START}{m.group(0)}{MARK_END}", piece)
    return ("\u2026" if start else "") + marked + ("\u2026" if start + width < len(text) else "")
