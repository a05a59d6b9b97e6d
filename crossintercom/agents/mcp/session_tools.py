"""MCP tools about the session itself: who and where it is, the status others see, and which
mail wakes it (docs/agents.md#wake-policy)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents.answered import check_one_line, check_text
from crossintercom.agents.handover.framing import one_line
from crossintercom.agents.mcp import results as res
from crossintercom.agents.mcp.results import guarded
from crossintercom.agents.session import AgentSession, unseen
from crossintercom.client import set_wake
from crossintercom.models import DESCRIPTION_CHARS, WakePolicy
from crossintercom.storage.urls import mask_url

_WAKE_TEXT = {
    "every": "every new message wakes you",
    "asks": "only asks (messages waiting for your answer) wake you; other mail waits in your inbox",
    "urgent": "only urgent mail wakes you; other mail waits in your inbox",
    "never": "nothing wakes you; read your inbox yourself",
}


class SessionTools:
    def __init__(self, session: AgentSession, supervisor: str | None) -> None:
        self.session = session
        self.supervisor = supervisor
        self.name = session.name

    @guarded
    async def whoami(self) -> CallToolResult:
        """Who and where you are, and what mail waits."""
        async with self.session.operation() as client:
            st = await client.status()
            waiting = len(await client.pending())
        info = client.session
        data = {
            "name": self.name,
            "host": self.session.settings.host_id,
            "session_id": self.session.identity.id,
            "supervisor": self.supervisor,
            "holds_session": self.session.owner,
            "status": info.status if info else None,
            "wake": await self.session.wake_policy(),
            "unseen": len(unseen(self.session.inbox)),
            "pending_asks": waiting,
            "relay_connected": st.relay.connected,
            "store": mask_url(self.session.settings.store_url)
            if self.session.settings.store_url
            else None,
        }
        text = (
            f"You are {self.name}@{one_line(data['host'])} (session {data['session_id']}). "
            f"Supervisor: {one_line(self.supervisor or 'none')}. Unseen messages: "
            f"{data['unseen']}; asks waiting for your reply: {waiting}. Other hosts "
            f"{'are' if data['relay_connected'] else 'are NOT'} reachable (relay)."
        )
        return res.ok(text, data)

    @guarded
    async def set_status(
        self,
        status: Annotated[
            str | None,
            Field(description="null clears it.", max_length=DESCRIPTION_CHARS),
        ],
    ) -> CallToolResult:
        """Set the one-line status others see in list_sessions."""
        if status is not None:
            check_text(status, "status")
            check_one_line("status", status)
        async with self.session.operation() as client:
            await client.set_status(status)
        return res.ok(f"Status {'cleared' if status is None else 'set'}.", {"status": status})

    @guarded
    async def set_wake(
        self,
        policy: WakePolicy,
    ) -> CallToolResult:
        """Which new mail wakes you when idle: every, asks, urgent or never."""
        async with self.session.operation() as client:
            info = await set_wake(client, policy)
        self.session.note_wake(info.wake)
        return res.ok(f"Wake policy {info.wake}: {_WAKE_TEXT[info.wake]}.", {"wake": info.wake})

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        return {
            "whoami": (self.whoami, True),
            "set_status": (self.set_status, False),
            "set_wake": (self.set_wake, False),
        }
