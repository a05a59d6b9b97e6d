"""Acknowledgements (docs/delivery.md#acknowledgement): what a session was asked to
acknowledge and has not yet, acknowledging it, and what it sent that still awaits one.

The recipient's side lives in its inbox (an acknowledged message carries the flag
``acknowledged``); the sender's side in its broker (``AckWaits``)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from crossintercom import protocol as p
from crossintercom.client.aio import AsyncClient
from crossintercom.client.connection import expect
from crossintercom.errors import BrokerUnavailable, Code, UsageError
from crossintercom.inbox import Inbox
from crossintercom.models import ACK_NOTE_CHARS, Peer
from crossintercom.timeparse import parse_sent_at

ACK_FLAG = "acknowledged"


class NotInInbox(UsageError):
    """No message with that id is in this session's inbox."""

    code = Code.NOT_FOUND


def _overdue(ack_by: object, now: float) -> bool:
    return isinstance(ack_by, str) and parse_sent_at(ack_by).timestamp() < now


async def synced_inbox(client: AsyncClient) -> Inbox:
    """This session's inbox once the broker has handed over what it queued while the session
    was away: a one-shot command connects and reads at once, before that backlog is saved."""
    await client.request(p.Ping(0))
    return client.inbox


def awaiting_mine(box: Inbox, now: float | None = None) -> list[dict[str, Any]]:
    """Messages in the inbox whose senders asked for an acknowledgement not given yet, oldest
    first, each with its age and whether it is overdue."""
    at = time.time() if now is None else now
    out = []
    for e in box.messages():
        b = e.body
        if b.get("ack_required") and ACK_FLAG not in (b.get("flags") or ()):
            sent = parse_sent_at(str(b.get("sent_at", ""))).timestamp()
            out.append(
                {
                    "id": b["id"],
                    "from": b.get("from"),
                    "sent_at": b.get("sent_at"),
                    "ack_by": b.get("ack_by"),
                    "age_s": round(at - sent, 1),
                    "overdue": _overdue(b.get("ack_by"), at),
                }
            )
    return out


def ack_frame(bodies: Iterable[Mapping[str, Any]], note: str | None = None) -> p.Acknowledge:
    items = [p.ShownItem(str(b["id"]), Peer.from_dict(b["from"])) for b in bodies]
    return p.Acknowledge(items, note)


def acknowledge(client: AsyncClient, ids: Iterable[str], note: str | None = None) -> list[str]:
    """Acknowledge messages in this session's inbox: their senders get an ``acknowledged``
    receipt. Raises ``NotInInbox`` for an id not in the inbox, ``UsageError`` for a note over
    ``ACK_NOTE_CHARS``, ``BrokerUnavailable`` when the broker cannot be reached (nothing is
    marked then)."""
    if note is not None and len(note) > ACK_NOTE_CHARS:
        # The broker drops a frame over the limit without an answer: refuse it here, before
        # anything is marked acknowledged.
        raise UsageError(f"the note is longer than {ACK_NOTE_CHARS} characters")
    box = client.inbox
    bodies = []
    for mid in dict.fromkeys(ids):
        entry = box.message(mid)
        if entry is None:
            raise NotInInbox(f"no message {mid} in this session's inbox")
        bodies.append(entry.body)
    if not bodies:
        return []
    if not client.post(ack_frame(bodies, note)):
        raise BrokerUnavailable("the broker is not reachable; nothing was acknowledged")
    for b in bodies:
        box.add_flag(str(b["id"]), ACK_FLAG)
    return [str(b["id"]) for b in bodies]


def acknowledge_answered(client: AsyncClient, ask_id: str) -> bool:
    """A reply acknowledges its ask when the asker asked for that (docs/delivery.md)."""
    entry = client.inbox.message(ask_id)
    if entry is None or not entry.body.get("ack_required"):
        return False
    if ACK_FLAG in (entry.body.get("flags") or ()):
        return False
    return bool(acknowledge(client, [ask_id]))


async def sent_awaiting(client: AsyncClient, now: float | None = None) -> list[dict[str, Any]]:
    """What this session sent with an acknowledgement request (kept for the retention), with
    ages, deadlines and the acknowledgements that came."""
    at = time.time() if now is None else now
    waits = expect(await client.request(p.AckWaits(0)), p.AckWaitList).items
    return [
        {
            "id": w.id,
            "to": w.to,
            "age_s": round(at - w.sent_at, 1),
            "ack_by": w.ack_by,
            "acknowledged": w.acknowledged_at is not None,
            "acknowledged_by": w.by,
            "note": w.note,
            "overdue": w.acknowledged_at is None and _overdue(w.ack_by, at),
        }
        for w in waits
    ]
