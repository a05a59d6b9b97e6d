"""Dead letters (docs/delivery.md#dead-letters): what a session sent that never reached its
recipient, and sending one again as a new message in the same thread."""

from __future__ import annotations

from typing import Any

from crossintercom import protocol as p
from crossintercom.client.aio import AsyncClient
from crossintercom.client.connection import expect
from crossintercom.models import SendResult, new_id


def dead_letter_json(d: p.DeadLetter) -> dict[str, Any]:
    """The CLI's and the MCP tool's shape of one dead letter."""
    m = d.message
    return {
        "id": d.id,
        "to": d.to,
        "recipient": d.recipient,
        "outcome": d.outcome,
        "code": d.code,
        "reason": d.reason,
        "at": d.at,
        "message": m.message,
        "subject": m.subject,
        "priority": m.priority,
        "attachments": [a.name for a in m.attachments],
        "resent_as": d.resent_as,
    }


async def dead_letters(client: AsyncClient, *, everyone: bool = False) -> list[p.DeadLetter]:
    """This session's dead letters, oldest first (``everyone``: every session's of the host)."""
    return expect(await client.request(p.DeadLetters(0, everyone)), p.DeadLetterList).items


async def resend(client: AsyncClient, message_id: str, recipient: str | None = None) -> SendResult:
    """Send dead letter ``message_id`` again (to ``recipient`` only, when it missed several)
    as a new message; its result is a send's."""
    frame = p.Resend(0, message_id, new_id(), recipient)
    result = expect(await client.request(frame), p.Result).send_result()
    client.post(p.Confirm([result.id]))  # the outcome is in hand: its dedup record can go
    return result
