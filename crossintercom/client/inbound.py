"""A session's inbound policy: rules by sender (accept, hold, refuse) and the mail they hold
(docs/agents.md#inbound-policy)."""

from __future__ import annotations

from typing import Any

from crossintercom import protocol as p
from crossintercom.client.aio import AsyncClient
from crossintercom.client.connection import expect


async def inbound_policy(
    client: AsyncClient,
    pattern: str | None = None,
    action: str | None = None,
    unhold: list[str] | None = None,
) -> p.InboundState:
    """The session's rules and held mail, after setting ``pattern``'s rule (``action`` None
    removes it) and letting the held mail ``unhold`` names out of the hold (``["*"]``: all of
    it), when given."""
    frame = p.InboundPolicy(0, pattern, action, unhold)
    return expect(await client.request(frame), p.InboundState)


def inbound_json(state: p.InboundState) -> dict[str, Any]:
    return {
        "rules": state.rules,
        "held": [
            {"id": h.id, "from": h.sender, "held_at": h.held_at, "message": h.message}
            for h in state.held
        ],
        "released": state.released,
    }
