"""Calls about a session rather than a message: ``shown`` reports, the wake policy, ``forget``
(docs/agents.md). Functions over an ``AsyncClient``; a ``Client`` runs them with ``Client.run``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from crossintercom import protocol as p
from crossintercom.client.aio import AsyncClient
from crossintercom.client.connection import expect
from crossintercom.models import Peer, SessionInfo, WakePolicy


def shown_frame(bodies: Iterable[Mapping[str, Any]]) -> p.Shown | None:
    """The ``shown`` report for message objects (as the inbox holds them); None for none."""
    items = [
        p.ShownItem(str(b["id"]), Peer.from_dict(b["from"]))
        for b in bodies
        if b.get("type", "message") == "message"
    ]
    return p.Shown(items) if items else None


async def report_shown(client: AsyncClient, bodies: Iterable[Mapping[str, Any]]) -> bool:
    """Tell the broker these messages were shown, so each sender gets a ``shown`` receipt.

    A notice, not mail: when the broker cannot be reached it is not sent (False).
    """
    frame = shown_frame(bodies)
    return frame is not None and client.post(frame)


async def set_wake(client: AsyncClient, wake: WakePolicy) -> SessionInfo:
    """Set the session's wake policy (kept with a durable session); returns the session."""
    return expect(await client.request(p.SetWake(0, wake)), p.Sessions).sessions[0]


async def forget(client: AsyncClient, session_id: str) -> p.Forgotten:
    """Drop a known session of this host (it must not be live); raises ``RemoteError``."""
    return expect(await client.request(p.Forget(0, session_id)), p.Forgotten)
