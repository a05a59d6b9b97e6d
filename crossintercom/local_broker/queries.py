"""Handlers of the query frames (docs/protocol.md): ping, the session list, status, groups,
asks waiting for a reply. They read the broker's rooms and change nothing; merged into the
broker's table so ``broker.py`` keeps to orchestration."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from crossintercom import protocol as p
from crossintercom.local_broker.authority import DedupAuthority
from crossintercom.local_broker.conn import Conn
from crossintercom.local_broker.delivery import Delivery
from crossintercom.local_broker.health import Health
from crossintercom.local_broker.inbound_policy import InboundPolicy
from crossintercom.local_broker.registry import Registry
from crossintercom.local_broker.relay_link import RelayLink
from crossintercom.local_broker.state import BrokerState
from crossintercom.models import Message


class Broker(Protocol):
    """What these handlers read of the broker."""

    host: str
    started: float
    authority: DedupAuthority
    state: BrokerState
    registry: Registry
    relay: RelayLink
    health: Health
    delivery: Delivery
    inbound: InboundPolicy


async def _on_ping(broker: Broker, conn: Conn, f: p.Ping) -> None:
    conn.write(p.Pong(f.request_id, broker.host, os.getpid()))


async def _on_list(broker: Broker, conn: Conn, f: p.ListSessions) -> None:
    conn.write(p.Sessions(f.request_id, broker.registry.all_sessions()))


async def _on_status(broker: Broker, conn: Conn, f: p.Status) -> None:
    records, nbytes = broker.authority.stats()
    reg = broker.registry
    conn.write(
        p.StatusReport(
            request_id=f.request_id,
            host_id=broker.host,
            pid=os.getpid(),
            uptime_s=round(time.time() - broker.started, 1),
            sessions=len([s for s in reg.local_sessions() if s.online]),
            remote_sessions=len([s for s in reg.remote.values() if s.online]),
            relay=p.RelayState(broker.relay.connected, broker.relay.store_status),
            queued=broker.state.queue_size(),
            dedup=p.DedupStats(records, nbytes),
            warnings=broker.health.warnings({s.id: s.display_name for s in reg.local_sessions()}),
            asks_waiting=len(broker.delivery.ask_waiters),
            inbound=broker.inbound.summary(),
        )
    )


async def _on_groups(broker: Broker, conn: Conn, f: p.Groups) -> None:
    groups: dict[str, list[p.GroupMember]] = {}
    for s in broker.registry.all_sessions():
        for g in s.groups:
            member = p.GroupMember(s.id, s.display_name, s.host, s.online)
            groups.setdefault(g, []).append(member)
    out = [p.Group(g, m) for g, m in sorted(groups.items())]
    conn.write(p.GroupList(f.request_id, out))


async def _on_pending(broker: Broker, conn: Conn, f: p.Pending) -> None:
    assert conn.session_id is not None
    entries = broker.state.open_pending(conn.session_id)
    conn.write(p.PendingList(f.request_id, [Message.from_dict(e.body) for e in entries]))


HANDLERS: dict[type, Callable[[Broker, Conn, Any], Coroutine[Any, Any, None]]] = {
    p.Ping: _on_ping,
    p.ListSessions: _on_list,
    p.Status: _on_status,
    p.Groups: _on_groups,
    p.Pending: _on_pending,
}
