"""Handlers of the coordination frames (docs/delivery.md#acknowledgement, #dead-letters;
docs/agents.md#inbound-policy, #path-reservations); the broker's dispatch table takes
``Coordination.handlers`` so ``broker.py`` keeps to orchestration."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec

from crossintercom import protocol as p
from crossintercom.errors import Code, ProtocolError
from crossintercom.local_broker.coord.acks import AckBook
from crossintercom.local_broker.coord.aftercare import Aftercare
from crossintercom.local_broker.coord.deadletters import DeadLetterBook
from crossintercom.local_broker.coord.inbound_policy import (
    ACTIONS,
    InboundPolicy,
    is_group,
    valid_pattern,
)
from crossintercom.local_broker.coord.reservations import ReservationDesk
from crossintercom.local_broker.delivery.local import Delivery
from crossintercom.local_broker.sessions.conn import Conn, Handler
from crossintercom.local_broker.sessions.registry import Registry


@dataclass(eq=False)
class Coordination:
    """The coordination frames' handlers over the rooms they use. ``send`` is how the broker
    sends a message for a connection and answers it (a resend is a send)."""

    registry: Registry
    aftercare: Aftercare
    acks: AckBook
    dead: DeadLetterBook
    inbound: InboundPolicy
    delivery: Delivery
    reservations: ReservationDesk
    send: Callable[[Conn, int, p.OutgoingBody], None]
    spawn: Callable[[Coroutine[Any, Any, Any]], None]

    def __post_init__(self) -> None:
        self.handlers: dict[type, Handler] = {
            p.Acknowledge: self._on_acknowledge,
            p.AckWaits: self._on_ack_waits,
            p.DeadLetters: self._on_dead_letters,
            p.Resend: self._on_resend,
            p.InboundPolicy: self._on_inbound,
            p.Reserve: self._on_reservation,
            p.Unreserve: self._on_reservation,
            p.Reservations: self._on_reservation,
            p.ReservationReply: self._on_reservation_reply,
        }

    async def _on_acknowledge(self, conn: Conn, f: p.Acknowledge) -> None:
        self.aftercare.acknowledged(conn, f)

    async def _on_ack_waits(self, conn: Conn, f: p.AckWaits) -> None:
        assert conn.session_id is not None
        waits = [_by_name(self.registry, w) for w in self.acks.of(conn.session_id)]
        conn.write(p.AckWaitList(f.request_id, waits))

    async def _on_dead_letters(self, conn: Conn, f: p.DeadLetters) -> None:
        assert conn.session_id is not None
        items = self.dead.of(None if f.everyone else conn.session_id)
        conn.write(p.DeadLetterList(f.request_id, items))

    async def _on_resend(self, conn: Conn, f: p.Resend) -> None:
        """A dead letter sent again: a new message to the recipient it missed, in the old
        one's thread; the dead letter records the new id."""
        assert conn.session_id is not None
        found = [
            d
            for d in self.dead.of(conn.session_id)
            if d.id == f.id and f.recipient in (None, d.recipient)
        ]
        if not found:
            to = "" if f.recipient is None else f" to {f.recipient[:80]!r}"
            raise ProtocolError(
                f"no dead letter {f.id}{to} sent by this session", code=Code.NOT_FOUND
            )
        dead = found[0]
        # A second resend would deliver a second copy; a retry of the same resend (same new
        # id) is answered by the dedup authority as a send's retry is.
        if dead.resent_as not in (None, f.new_id):
            raise ProtocolError(
                f"dead letter {f.id} was already resent as {dead.resent_as}; "
                "if that one failed too, resend it",
                code=Code.ALREADY_RESENT,
            )
        body = msgspec.structs.replace(
            dead.message,
            id=f.new_id,
            to=dead.recipient or dead.to,
            thread_id=dead.message.thread_id or dead.id,
            ack_by=None,
        )
        self.dead.resent(dead.id, dead.recipient, f.new_id)
        self.send(conn, f.request_id, body)

    async def _on_inbound(self, conn: Conn, f: p.InboundPolicy) -> None:
        sid = conn.session_id
        assert sid is not None
        policy = self.inbound
        if f.pattern is not None or f.release is not None:
            self.reservations.admit(sid)
        if f.pattern is not None:
            if not valid_pattern(f.pattern):
                raise ProtocolError(
                    f"{f.pattern[:80]!r} is not NAME, NAME@HOST, *@HOST, group:NAME or *",
                    code=Code.INVALID_ARGUMENT,
                )
            action = next((a for a in ACTIONS if a == f.action), None)
            if f.action is not None and action is None:
                raise ProtocolError("action must be accept, hold or refuse", code=Code.BAD_FIELD)
            if action == "accept" and is_group(f.pattern):
                # Anyone may join a group, so accepting one admits anyone (docs/agents.md).
                raise ProtocolError(
                    f"{f.pattern[:80]!r} cannot be accepted: anyone may join a group, so it "
                    "would admit anyone; a group may be held or refused, and senders accepted "
                    "by NAME@HOST, NAME or *@HOST",
                    code=Code.INVALID_ARGUMENT,
                )
            policy.set(sid, f.pattern, action)
        unheld = 0
        if f.release is not None:
            taken = policy.take(sid, None if "*" in f.release else f.release)
            for msg in taken:  # queued as mail that waited while the session was away
                self.delivery.queue_unheld(sid, msg)
            owner = self.registry.owner(sid)
            if taken and owner is not None:
                self.delivery.drain_backlog(owner, sid)
            unheld = len(taken)
        held = [
            p.HeldMail(mid, _sender(body), at, str(body.get("message", "")))
            for mid, body, at in policy.held(sid)
        ]
        conn.write(p.InboundState(f.request_id, policy.rules(sid), held, unheld))

    async def _on_reservation(
        self, conn: Conn, f: p.Reserve | p.Unreserve | p.Reservations
    ) -> None:
        assert conn.session_id is not None
        frame = self.reservations.request(conn.session_id, f)
        self.spawn(self.reservations.answer(conn, f.request_id, frame))

    async def _on_reservation_reply(self, conn: Conn, f: p.ReservationReply) -> None:
        self.reservations.answered(f)


def _by_name(registry: Registry, wait: p.AckWait) -> p.AckWait:
    """The acknowledging session by NAME@HOST where the roster still knows it: receipts name
    a session id, which means nothing to a person reading `acks --sent`."""
    if wait.by is None:
        return wait
    info = registry.snapshot().by_id.get(wait.by.split("@", 1)[0])
    if info is None or info.name is None:
        return wait
    return msgspec.structs.replace(wait, by=f"{info.name}@{info.host}")


def _sender(body: dict[str, Any]) -> str:
    s = body.get("from") or {}
    return f"{s.get('name') or s.get('id')}@{s.get('host')}"
