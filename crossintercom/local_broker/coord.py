"""Handlers of the coordination frames (docs/delivery.md#acknowledgement, #dead-letters),
merged into the broker's table so ``broker.py`` keeps to orchestration."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import msgspec

from crossintercom import protocol as p
from crossintercom.errors import Code, ProtocolError
from crossintercom.local_broker.acks import AckBook
from crossintercom.local_broker.aftercare import Aftercare
from crossintercom.local_broker.conn import Conn
from crossintercom.local_broker.deadletters import DeadLetterBook
from crossintercom.local_broker.sending import Operations
from crossintercom.models import SendResult


class Broker(Protocol):
    """What these handlers use of the broker."""

    aftercare: Aftercare
    acks: AckBook
    dead: DeadLetterBook
    ops: Operations

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    async def _answer(
        self,
        conn: Conn,
        request_id: int,
        body: p.OutgoingBody,
        work: Coroutine[Any, Any, SendResult],
    ) -> None: ...


async def _on_acknowledge(broker: Broker, conn: Conn, f: p.Acknowledge) -> None:
    broker.aftercare.acknowledged(conn, f)


async def _on_ack_waits(broker: Broker, conn: Conn, f: p.AckWaits) -> None:
    assert conn.session_id is not None
    conn.write(p.AckWaitList(f.request_id, broker.acks.of(conn.session_id)))


async def _on_dead_letters(broker: Broker, conn: Conn, f: p.DeadLetters) -> None:
    assert conn.session_id is not None
    items = broker.dead.of(None if f.everyone else conn.session_id)
    conn.write(p.DeadLetterList(f.request_id, items))


async def _on_resend(broker: Broker, conn: Conn, f: p.Resend) -> None:
    """A dead letter sent again: a new message to the recipient it missed, in the old one's
    thread; the dead letter records the new id."""
    assert conn.session_id is not None
    found = [
        d
        for d in broker.dead.of(conn.session_id)
        if d.id == f.id and f.recipient in (None, d.recipient)
    ]
    if not found:
        raise ProtocolError(f"no dead letter {f.id} sent by this session", code=Code.NOT_FOUND)
    dead = found[0]
    body = msgspec.structs.replace(
        dead.message,
        id=f.new_id,
        to=dead.recipient or dead.to,
        thread_id=dead.message.thread_id or dead.id,
        ack_by=None,
    )
    broker.dead.resent(dead.id, dead.recipient, f.new_id)
    broker.ops.commits.busy += 1  # counted from its arrival, as a send is
    broker.spawn(broker._answer(conn, f.request_id, body, broker.ops.send(conn, body)))


HANDLERS: dict[type, Callable[[Broker, Conn, Any], Coroutine[Any, Any, None]]] = {
    p.Acknowledge: _on_acknowledge,
    p.AckWaits: _on_ack_waits,
    p.DeadLetters: _on_dead_letters,
    p.Resend: _on_resend,
}
