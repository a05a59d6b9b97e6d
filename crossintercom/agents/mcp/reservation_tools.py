"""MCP tools for path reservations (docs/agents.md#path-reservations): reserve, unreserve and
reservations (with a conflict check of paths), the CLI's commands of the same names. Without a
``project`` the key comes from the checkout the server runs in, as the CLI's does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Literal

import msgspec
from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents.answered import check_one_line
from crossintercom.agents.handover.framing import one_line, quoted
from crossintercom.agents.mcp import results as res
from crossintercom.agents.mcp.results import guarded
from crossintercom.agents.session import AgentSession
from crossintercom.client import (
    project_key,
    repo_paths,
    reservation_json,
    reservation_line,
    reservations,
    reserve,
    unreserve,
)
from crossintercom.client.reservations import held
from crossintercom.codes import Code
from crossintercom.protocol import Reservation
from crossintercom.reservations import path_conflicts

Project = Annotated[
    str | None,
    Field(description="Default: this checkout's origin remote."),
]
Globs = Annotated[
    list[str],
    Field(
        description="From the checkout's top: src/**, docs/*.md, lib/.",
        min_length=1,
        max_length=100,
    ),
]


class ReservationTools:
    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @guarded
    async def reserve(
        self,
        globs: Globs,
        mode: Annotated[
            Literal["exclusive", "shared"],
            Field(description="shared: others may share it."),
        ] = "exclusive",
        ttl_s: Annotated[int, Field(gt=0, le=30 * 86400)] = 3600,
        reason: Annotated[str | None, Field(description="One line, for others.")] = None,
        project: Project = None,
    ) -> CallToolResult:
        """Reserve paths you are about to change, all or none; refused with the clashes when
        another session holds an overlapping one. Again: renews."""
        check_one_line("reason", reason)
        key = project_key(project)
        async with self.session.operation() as client:
            state = await reserve(client, key, globs, mode, ttl_s, reason)
        if state.code == Code.RESERVATION_CONFLICT:
            rows = [reservation_json(r) for r in state.conflicts]
            # Said here, not in the relay's words: its sentence holds the holders' globs and
            # reasons raw, and an error's text is flattened, quote marks and all, so it names
            # only the holders (the reservations tool quotes the rest as their words).
            holders = dict.fromkeys(f"{r.name or r.session}@{r.host}" for r in state.conflicts)
            why = (
                f"not reserved ({', '.join(globs)}): clashes with {len(state.conflicts)} "
                f"reservation(s) of {', '.join(holders)}; nothing was reserved (the reservations "
                "tool shows each, and why it is held)"
            )
            return res.error(state.code, why, conflicts=rows)
        me = self.session.identity.id
        lines = [f"- {_line(r, me)}" for r in state.items]
        data = {"project": key, "reserved": [reservation_json(r) for r in state.items]}
        return res.ok(f"Reserved in {one_line(key)}:\n" + "\n".join(lines), data)

    @guarded
    async def unreserve(
        self,
        globs: Annotated[list[str] | None, Field(description="Default: all of yours.")] = None,
        project: Project = None,
    ) -> CallToolResult:
        """Release your reservations."""
        key = project_key(project)
        async with self.session.operation() as client:
            state = await unreserve(client, key, globs)
        data = {
            "project": key,
            "released": state.released,
            "held": [reservation_json(r) for r in state.items],
        }
        return res.ok(f"Released {state.released}.", data)

    @guarded
    async def reservations(
        self,
        conflicts: Annotated[
            list[str] | None,
            Field(description="Paths you would change: only what clashes."),
        ] = None,
        project: Project = None,
    ) -> CallToolResult:
        """Live reservations of the project on every machine."""
        key = project_key(project)
        async with self.session.operation() as client:
            state = await reservations(client, key)
        me = self.session.identity.id
        more = (
            ["(more reservations than one answer carries were left out: the oldest are shown)"]
            if state.more
            else []
        )
        if conflicts is None:
            rows = [reservation_json(r) for r in state.items]
            lines = [f"- {_line(r, me)}" for r in state.items] + more
            return res.ok(
                "\n".join(lines) or "No reservations.", {"project": key, "reservations": rows}
            )
        by_id = {r.id: r for r in state.items}
        found = path_conflicts([held(r) for r in state.items], me, repo_paths(conflicts))
        rows = [{"path": path, **reservation_json(by_id[h.id])} for path, h in found]
        lines = [f"- {one_line(path)}: {_line(by_id[h.id], me)}" for path, h in found] + more
        return res.ok("\n".join(lines) or "No conflicts.", {"project": key, "conflicts": rows})

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        return {
            "reserve": (self.reserve, False),
            "unreserve": (self.unreserve, False),
            "reservations": (self.reservations, True),
        }


def _line(r: Reservation, me: str | None = None) -> str:
    """One reservation for a model. Another session's glob and reason are that session's words
    (up to 500 characters each of free text), quoted as such (as a status is in
    list_sessions), so they cannot pose as ours or the user's; the caller's own (``me``, its
    session id) are shown plain."""
    rest = one_line(reservation_line(msgspec.structs.replace(r, glob="", reason=None))).strip()
    if r.session == me:
        return f"{one_line(r.glob)} {rest}"
    line = f"{quoted(r.glob)} (its holder's glob) {rest}"
    if not r.reason:
        return line
    return line + f"; its reason, in its holder's own words: {quoted(r.reason)}"
