"""Where the page's messages come from, each read as ``(id, message or None, receipts)`` for
``FeedStore.merge`` (docs/web.md, "Where the feed comes from"):

- the broker's traffic log: every message this host's sessions sent, received or had refused,
  with receipts as they pass (``traffic``; the broker keeps it in memory, bounded);
- the inboxes on this host: mail received before the page or the broker started;
- the archive, when it is on: every host's messages (read by the overseer).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from crossintercom import protocol as p
from crossintercom.inbox import Inbox, session_ids
from crossintercom.models import SETTLED, Message, Outcome
from crossintercom.storage import ArchivedMessage, ArchiveRecipient

log = logging.getLogger(__name__)

Item = tuple[str, dict[str, Any] | None, list[dict[str, Any]]]


def message_json(msg: Message) -> dict[str, Any]:
    """The CLI's message object."""
    return msg.to_dict()


def receipt(
    outcome: str,
    session_id: str | None,
    host: str | None,
    name: str | None = None,
    code: str | None = None,
    text: str | None = None,
) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "host": host,
        "name": name,
        "outcome": outcome,
        "code": code,
        "text": text,
    }


def from_traffic(events: Iterable[p.TrafficEvent]) -> list[Item]:
    return [
        (
            e.id,
            {**message_json(e.message), "seen_at": e.at} if e.message is not None else None,
            [
                receipt(r.outcome.value, r.recipient, r.host, r.name, r.code, r.message)
                for r in e.receipts
            ],
        )
        for e in events
    ]


def from_archive(rows: Iterable[ArchivedMessage]) -> list[Item]:
    return [(r.message.id, message_json(r.message), archived_receipts(r.recipients)) for r in rows]


def archived_receipts(recipients: Iterable[ArchiveRecipient]) -> list[dict[str, Any]]:
    return [receipt(x.outcome, x.session_id, x.host_id, x.name, x.code) for x in recipients]


def unsettled(items: Iterable[dict[str, Any]]) -> list[str]:
    """Ids of the messages (as the feed holds them) whose receipts may still move on: the
    archive is asked for these again, since a later receipt changes a row, not the feed."""
    return [
        m["id"]
        for m in items
        # Settled outcomes never move again (docs/archive.md): their receipts are not re-read.
        if any(r.get("outcome") not in SETTLED for r in m.get("recipients") or ())
    ]


class InboxReader:
    """New entries of every inbox on this host since the last read (what its sessions
    received, with ``shown`` where their agent was shown it)."""

    def __init__(self, inbox_dir: Path, host: str) -> None:
        self.inbox_dir = inbox_dir
        self.host = host
        self._seq: dict[str, int] = {}

    def read(self) -> list[Item]:
        out: list[Item] = []
        for sid in session_ids(self.inbox_dir):
            try:
                box = Inbox.view(self.inbox_dir, sid)
            except Exception:
                continue
            try:
                for entry in box.messages_after(self._seq.get(sid, 0)):
                    self._seq[sid] = entry.seq
                    with contextlib.suppress(ValueError):
                        msg = Message.from_dict(entry.body)
                        outcome = Outcome.SHOWN if entry.shown else Outcome.DELIVERED
                        out.append((msg.id, message_json(msg), [receipt(outcome, sid, self.host)]))
            except Exception as exc:
                log.debug("inbox %s unreadable: %s", sid, exc)
            finally:
                box.close()
        return out
