"""The queries a client makes of its broker (docs/protocol.md): sessions, status, groups,
asks waiting, membership, the status text. ``AsyncClient`` supplies ``request``."""

from __future__ import annotations

import msgspec

from crossintercom import protocol as p
from crossintercom.client.connection import expect
from crossintercom.models import Message, SessionInfo


class Queries:
    async def request(self, frame: msgspec.Struct) -> p.BrokerFrame:
        """Any request frame, answered by the broker."""
        raise NotImplementedError

    async def list_sessions(self) -> list[SessionInfo]:
        return expect(await self.request(p.ListSessions(0)), p.Sessions).sessions

    async def status(self) -> p.StatusReport:
        return expect(await self.request(p.Status(0)), p.StatusReport)

    async def counts(self) -> p.CountsReport:
        return expect(await self.request(p.Counts(0)), p.CountsReport)

    async def groups(self) -> list[p.Group]:
        return expect(await self.request(p.Groups(0)), p.GroupList).groups

    async def pending(self) -> list[Message]:
        return expect(await self.request(p.Pending(0)), p.PendingList).messages

    async def traffic(self, after: int = 0, limit: int = 1000) -> p.TrafficLog:
        """This host's recent traffic as its broker saw it pass (docs/web.md)."""
        return expect(await self.request(p.Traffic(0, after, limit)), p.TrafficLog)

    async def join(self, group: str) -> list[str]:
        return expect(await self.request(p.Join(0, group)), p.Ok).groups or []

    async def leave(self, group: str) -> list[str]:
        return expect(await self.request(p.Leave(0, group)), p.Ok).groups or []

    async def set_status(self, status: str | None) -> None:
        expect(await self.request(p.SetStatus(0, status)), p.Ok)
