"""MCP tools for what became of the mail the session sent: its receipts, the dead letters that
never arrived, and sending one again (docs/delivery.md#dead-letters)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents.handover.framing import header_field, one_line, quoted
from crossintercom.agents.mcp import results as res
from crossintercom.agents.mcp.results import guarded
from crossintercom.agents.session import AgentSession
from crossintercom.client import dead_letter_json, dead_letters, resend
from crossintercom.models import Outcome


class SentTools:
    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @guarded
    async def receipts(
        self,
        message_id: str | None = None,
        limit: Annotated[int, Field(ge=1, le=500)] = 50,
    ) -> CallToolResult:
        """What became of messages you sent (delivered, shown, expired ...), newest last."""
        found = [
            e.body
            for e in self.session.inbox.receipts()
            if message_id is None or e.body.get("id") == message_id
        ][-limit:]
        lines = [_receipt_line(r) for r in found]
        return res.text_only("\n".join(lines) or "No receipts.")

    @guarded
    async def dead_letters(self) -> CallToolResult:
        """Messages you sent that never arrived, and why."""
        async with self.session.operation() as client:
            rows = [dead_letter_json(d) for d in await dead_letters(client)]
        lines = [
            f"- {one_line(r['id'])} to {one_line(r['to'])}: {one_line(r['outcome'])} "
            f"({one_line(r['code'] or r['outcome'])})"
            + (f", resent as {one_line(r['resent_as'])}" if r["resent_as"] else "")
            for r in rows
        ]
        return res.ok("\n".join(lines) or "No dead letters.", {"dead_letters": rows})

    @guarded
    async def resend(
        self,
        message_id: Annotated[str, Field(description="A dead letter's id.")],
        recipient: Annotated[str | None, Field(description="Only this session id.")] = None,
    ) -> CallToolResult:
        """Send a dead letter again, as a new message in its thread."""
        async with self.session.operation() as client:
            result = await resend(client, message_id, recipient)
        return res.outcome(result)

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        return {
            "receipts": (self.receipts, True),
            "dead_letters": (self.dead_letters, True),
            "resend": (self.resend, False),
        }


def _receipt_line(r: Mapping[str, Any]) -> str:
    f = header_field
    line = f"- {f(r.get('id'))} to {f(r.get('recipient') or '?')}"
    line += (f"@{f(r['host'])}" if r.get("host") else "") + f": {f(r.get('outcome'))}"
    line += f" ({f(r['code'])})" if r.get("code") else ""
    if r.get("message") and r.get("outcome") == Outcome.ACKNOWLEDGED:
        # An acknowledgement's note is the recipient's free text, quoted as such.
        return line + f"; its note, in its own words: {quoted(r['message'])}"
    return line + (f": {one_line(r['message'])}" if r.get("message") else "")
