"""MCP tools for the other sessions and the groups: who can be messaged on every host, the
groups and their members, joining and leaving one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from mcp.types import CallToolResult

from crossintercom.agents.handover.framing import one_line
from crossintercom.agents.mcp import results as res
from crossintercom.agents.mcp.results import guarded
from crossintercom.agents.session import AgentSession
from crossintercom.errors import UsageError
from crossintercom.models import NAME_RULE, valid_name


def _check_group(group: str) -> None:
    if not valid_name(group):
        raise UsageError(f"invalid group name: {NAME_RULE}; nothing was done")


class RosterTools:
    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @guarded
    async def list_sessions(
        self,
        online_only: bool = True,
        host: str | None = None,
        group: str | None = None,
    ) -> CallToolResult:
        """Sessions on every host you can message."""
        async with self.session.operation() as client:
            found = await client.list_sessions()
        found = [
            s
            for s in found
            if (s.online or not online_only)
            and (host is None or s.host == host)
            and (group is None or group in s.groups)
        ]
        note = "Online sessions:" if online_only else "Sessions (online and known offline):"
        return res.sessions(found, note)

    @guarded
    async def groups(self) -> CallToolResult:
        """Groups on every host and their members."""
        async with self.session.operation() as client:
            found = await client.groups()
        lines = [
            f"- {one_line(g.name)}: "
            + ", ".join(f"{one_line(m.name)}@{one_line(m.host)}" for m in g.members)
            for g in found
        ]
        return res.text_only("\n".join(lines) or "No groups.")

    @guarded
    async def join(self, group: str) -> CallToolResult:
        """Join a group."""
        _check_group(group)
        async with self.session.operation() as client:
            now = await client.join(group)
        return res.ok(f"You are in: {', '.join(map(one_line, now))}.", {"groups": now})

    @guarded
    async def leave(self, group: str) -> CallToolResult:
        """Leave a group."""
        _check_group(group)
        async with self.session.operation() as client:
            now = await client.leave(group)
        joined = ", ".join(map(one_line, now)) or "(no groups)"
        return res.ok(f"You are in: {joined}.", {"groups": now})

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        return {
            "list_sessions": (self.list_sessions, True),
            "groups": (self.groups, True),
            "join": (self.join, False),
            "leave": (self.leave, False),
        }
