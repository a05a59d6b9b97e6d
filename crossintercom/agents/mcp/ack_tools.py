"""MCP tools for acknowledgements (docs/delivery.md#acknowledgement): acknowledging messages
whose senders asked for it, and what awaits an acknowledgement, from the session or from others."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents.answered import check_one_line
from crossintercom.agents.handover.framing import header_field, one_line, quoted
from crossintercom.agents.mcp import results as res
from crossintercom.agents.mcp.results import guarded
from crossintercom.agents.session import AgentSession
from crossintercom.client import acknowledge, awaiting_mine, sent_awaiting
from crossintercom.models import ACK_NOTE_CHARS


class AckTools:
    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @guarded
    async def ack(
        self,
        message_ids: Annotated[list[str], Field(min_length=1)],
        note: Annotated[
            str | None, Field(description="One line for the sender.", max_length=ACK_NOTE_CHARS)
        ] = None,
    ) -> CallToolResult:
        """Acknowledge messages whose senders asked for it (a reply needs none)."""
        check_one_line("note", note)
        done = acknowledge(self.session.client, message_ids, note)
        return res.ok(f"Acknowledged {', '.join(done)}.", {"acknowledged": done})

    @guarded
    async def acks(
        self,
        sent: Annotated[bool, Field(description="true: what you sent.")] = False,
    ) -> CallToolResult:
        """Messages awaiting your acknowledgement (or sent: others'), ages, overdue ones."""
        if sent:
            async with self.session.operation() as client:
                rows = await sent_awaiting(client)
        else:
            rows = awaiting_mine(self.session.inbox)
        lines = [
            f"- {one_line(r['id'])} {_ack_line(r, sent)}, {r['age_s']:.0f}s ago"
            + (" OVERDUE" if r["overdue"] else "")
            for r in rows
        ]
        return res.text_only("\n".join(lines) or "Nothing awaits acknowledgement.")

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        return {
            "ack": (self.ack, False),
            "acks": (self.acks, True),
        }


def _ack_line(r: Mapping[str, Any], sent: bool) -> str:
    f = header_field
    if not sent:
        sender = r.get("from") or {}
        return f"from {f(sender.get('name') or sender.get('id'))}@{f(sender.get('host'))}"
    if r["acknowledged"]:
        note = f"; its note, in its own words: {quoted(r['note'])}" if r.get("note") else ""
        return f"to {f(r['to'])}: acknowledged by {f(r['acknowledged_by'])}{note}"
    return f"to {f(r['to'])}: awaiting"
