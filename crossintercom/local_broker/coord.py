"""Handlers of the coordination frames (docs/delivery.md#acknowledgement), merged into the
broker's table so ``broker.py`` keeps to orchestration."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from crossintercom import protocol as p
from crossintercom.local_broker.acks import AckBook
from crossintercom.local_broker.aftercare import Aftercare
from crossintercom.local_broker.conn import Conn


class Broker(Protocol):
    """What these handlers use of the broker."""

    aftercare: Aftercare
    acks: AckBook


async def _on_acknowledge(broker: Broker, conn: Conn, f: p.Acknowledge) -> None:
    broker.aftercare.acknowledged(conn, f)


async def _on_ack_waits(broker: Broker, conn: Conn, f: p.AckWaits) -> None:
    assert conn.session_id is not None
    conn.write(p.AckWaitList(f.request_id, broker.acks.of(conn.session_id)))


HANDLERS: dict[type, Callable[[Broker, Conn, Any], Coroutine[Any, Any, None]]] = {
    p.Acknowledge: _on_acknowledge,
    p.AckWaits: _on_ack_waits,
}
