"""Handlers of the query frames (docs/protocol.md): ping, the session list, status, groups,
asks waiting for a reply. They read the broker's rooms and change nothing; the broker's
dispatch table takes ``Queries.handlers`` so ``broker.py`` keeps to orchestration."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from crossintercom import protocol as p
from crossintercom.local_broker.authority.dedup import DedupAuthority
from crossintercom.local_broker.coord.deadletters import DeadLetterBook
from crossintercom.local_broker.coord.inbound_policy import InboundPolicy
from crossintercom.local_broker.delivery.local import Delivery
from crossintercom.local_broker.delivery.relay_link import RelayLink
from crossintercom.local_broker.health import Health
from crossintercom.local_broker.sessions.conn import Conn, Handler
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import Message


@dataclass(eq=False)
class Queries:
    """The query frames' handlers over the rooms they read."""

    host: str
    authority: DedupAuthority
    state: BrokerState
    registry: Registry
    relay: RelayLink
    health: Health
    delivery: Delivery
    inbound: InboundPolicy
    dead: DeadLetterBook
    started: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.handlers: dict[type, Handler] = {
            p.Ping: self._on_ping,
            p.ListSessions: self._on_list,
            p.Status: self._on_status,
            p.Counts: self._on_counts,
            p.Groups: self._on_groups,
            p.Pending: self._on_pending,
        }

    async def _on_ping(self, conn: Conn, f: p.Ping) -> None:
        conn.write(p.Pong(f.request_id, self.host, os.getpid()))

    async def _on_list(self, conn: Conn, f: p.ListSessions) -> None:
        conn.write(p.Sessions(f.request_id, self.registry.all_sessions()))

    async def _on_status(self, conn: Conn, f: p.Status) -> None:
        records, nbytes = self.authority.stats()
        reg = self.registry
        local = reg.local_sessions()
        conn.write(
            p.StatusReport(
                request_id=f.request_id,
                host_id=self.host,
                pid=os.getpid(),
                uptime_s=round(time.time() - self.started, 1),
                sessions=len([s for s in local if s.online]),
                remote_sessions=len([s for s in reg.remote.values() if s.online]),
                relay=p.RelayState(self.relay.connected, self.relay.store_status),
                queued=self.state.queue_size(),
                dedup=p.DedupStats(records, nbytes),
                warnings=self.health.warnings({s.id: s.display_name for s in local}),
                asks_waiting=len(self.delivery.ask_waiters),
                inbound=self.inbound.summary(),
            )
        )

    async def _on_counts(self, conn: Conn, f: p.Counts) -> None:
        conn.write(p.CountsReport(f.request_id, self.inbound.held_count(), self.dead.count()))

    async def _on_groups(self, conn: Conn, f: p.Groups) -> None:
        groups: dict[str, list[p.GroupMember]] = {}
        for s in self.registry.all_sessions():
            for g in s.groups:
                member = p.GroupMember(s.id, s.display_name, s.host, s.online)
                groups.setdefault(g, []).append(member)
        out = [p.Group(g, m) for g, m in sorted(groups.items())]
        conn.write(p.GroupList(f.request_id, out))

    async def _on_pending(self, conn: Conn, f: p.Pending) -> None:
        assert conn.session_id is not None
        entries = self.state.open_pending(conn.session_id)
        conn.write(p.PendingList(f.request_id, [Message.from_dict(e.body) for e in entries]))
