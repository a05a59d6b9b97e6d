"""MCP tools about the session itself: its wake policy and the receipts for what it sent
(docs/agents.md#the-mcp-server). Beside ``mcp_tools``, which maps the mailbox operations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents import mcp_results as res
from crossintercom.agents.framing import one_line
from crossintercom.agents.mcp_tools import guarded
from crossintercom.agents.session import AgentSession
from crossintercom.client import set_wake
from crossintercom.models import WakePolicy

_WAKE_TEXT = {
    "every": "every new message wakes you",
    "asks": "only asks (messages waiting for your answer) wake you; other mail waits in your inbox",
    "urgent": "only urgent mail wakes you; other mail waits in your inbox",
    "never": "nothing wakes you; read your inbox yourself",
}


class SessionTools:
    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @guarded
    async def set_wake(
        self,
        policy: Annotated[
            WakePolicy,
            Field(
                description="every: any message wakes you; asks: only asks; urgent: only "
                "urgent mail; never: none."
            ),
        ],
    ) -> CallToolResult:
        """Choose which new mail wakes you when idle (kept for this session)."""
        async with self.session.operation() as client:
            info = await set_wake(client, policy)
        self.session.note_wake(info.wake)
        return res.ok(f"Wake policy {info.wake}: {_WAKE_TEXT[info.wake]}.", {"wake": info.wake})

    @guarded
    async def receipts(
        self,
        message_id: Annotated[
            str | None, Field(description="Only receipts for this message you sent.")
        ] = None,
        limit: Annotated[int, Field(description="At most this many.", ge=1, le=500)] = 50,
    ) -> CallToolResult:
        """What became of messages you sent: delivered (saved by the recipient), shown (its
        agent was shown it), queued, expired, refused; newest last."""
        found = [
            e.body
            for e in self.session.inbox.receipts()
            if message_id is None or e.body.get("id") == message_id
        ][-limit:]
        lines = [
            f"- {one_line(r.get('id'))} to {one_line(r.get('recipient') or '?')}"
            + (f"@{one_line(r['host'])}" if r.get("host") else "")
            + f": {one_line(r.get('outcome'))}"
            + (f" ({one_line(r['code'])})" if r.get("code") else "")
            for r in found
        ]
        return res.ok("\n".join(lines) or "No receipts.", {"receipts": found})

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        tools: dict[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]] = {
            "set_wake": (self.set_wake, False),
            "receipts": (self.receipts, True),
        }
        return tools
