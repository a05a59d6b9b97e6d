"""The MCP tool for the session's inbound policy (docs/agents.md#inbound-policy): accept, hold
or refuse a sender's mail, and release held mail."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents.handover.framing import header_field, one_line
from crossintercom.agents.mcp import results as res
from crossintercom.agents.mcp.results import guarded
from crossintercom.agents.session import AgentSession
from crossintercom.client import inbound_json, inbound_policy
from crossintercom.errors import UsageError


class InboundTools:
    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @guarded
    async def inbound_policy(
        self,
        pattern: Annotated[
            str | None,
            Field(description="NAME, NAME@HOST, *@HOST, group:NAME (hold, refuse only) or *."),
        ] = None,
        action: Literal["accept", "hold", "refuse"] | None = None,
        remove: bool = False,
        release: Annotated[list[str] | None, Field(description="Held ids; ['*']: all.")] = None,
    ) -> CallToolResult:
        """Accept, hold or refuse a sender's mail; release held mail. No arguments: list."""
        if pattern is not None and action is None and not remove:
            raise UsageError("give an action for the pattern, or remove=true")
        async with self.session.operation() as client:
            state = await inbound_policy(client, pattern, None if remove else action, release)
        out = inbound_json(state)
        lines = [f"- {one_line(k)}: {v}" for k, v in out["rules"].items()] or ["No rules."]
        # Held mail is another session's words: never shown here, outside its frame; released,
        # it is read framed (docs/agents.md). Its sender is text only, as in list_sessions.
        lines += [
            f"held {header_field(h['id'])} from {header_field(h['from'])}, "
            f"{len(h['message'])} characters (release it to read it)"
            for h in out["held"]
        ]
        if out["released"]:
            lines.append(f"Released {out['released']}: read it with inbox.")
        return res.text_only("\n".join(lines))

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        return {"inbound_policy": (self.inbound_policy, False)}
