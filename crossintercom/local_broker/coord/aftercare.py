"""What happens to a message after it was delivered, and to a session after it stops being used:
``shown`` receipts for senders, the wake policy, ``forget`` (its queued and held mail, its
inbound rules), and expiry receipts (docs/agents.md). A receipt for a sender on this host is
shown to it; one for a sender on another host goes through the relay (``send_receipts``), which
writes it to the store; while no relay is connected it waits in ``broker.sqlite`` for the next
one.
"""

from __future__ import annotations

import logging

from crossintercom import protocol as p
from crossintercom.errors import Code, ProtocolError
from crossintercom.local_broker.coord.acks import AckBook
from crossintercom.local_broker.coord.deadletters import DeadLetterBook
from crossintercom.local_broker.coord.inbound_policy import InboundPolicy
from crossintercom.local_broker.delivery.local import Delivery
from crossintercom.local_broker.delivery.relay_link import RelayLink
from crossintercom.local_broker.sessions.conn import Conn
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state.store import BrokerState, QueuedItem
from crossintercom.models import (
    Message,
    Outcome,
    Peer,
    Receipt,
    SessionInfo,
    State,
    WakePolicy,
    outcome_for_state,
)

log = logging.getLogger(__name__)
_HOST_OUTCOMES: dict[Outcome, p.HostReceiptOutcome] = {
    Outcome.SHOWN: Outcome.SHOWN.value,
    Outcome.ACKNOWLEDGED: Outcome.ACKNOWLEDGED.value,
}


class Aftercare:
    def __init__(
        self,
        host: str,
        registry: Registry,
        state: BrokerState,
        delivery: Delivery,
        relay: RelayLink,
    ) -> None:
        self.host = host
        self.registry = registry
        self.state = state
        self.delivery = delivery
        self.relay = relay
        self.acks: AckBook | None = None  # set by the broker
        self.dead: DeadLetterBook | None = None
        self.inbound: InboundPolicy | None = None

    def _tell(self, receipts: list[tuple[Peer, Receipt]]) -> None:
        """Receipts for messages' senders: shown here, or carried to their hosts together."""
        remote: list[p.ReceiptFor] = []
        local: list[tuple[str, Receipt]] = []
        if self.relay.traffic is not None:
            self.relay.traffic.receipts(r for _, r in receipts)
        if self.acks is not None:
            self.acks.note(r for _, r in receipts)
        if self.dead is not None:
            self.dead.note(r for _, r in receipts)
        for sender, receipt in receipts:
            if sender.host == self.host:
                local.append((sender.id, receipt))
            elif receipt.recipient is not None:
                outcome: p.HostReceiptOutcome = _HOST_OUTCOMES.get(
                    receipt.outcome, Outcome.EXPIRED.value
                )
                note = receipt.message if outcome == Outcome.ACKNOWLEDGED.value else None
                remote.append(
                    p.ReceiptFor(receipt.id, receipt.recipient, sender, outcome, receipt.code, note)
                )
        self.delivery.notify_senders(local)
        self.relay.send_receipts(remote)
        # Every recipient here is this host's: the archive learns what only this host knows.
        self.relay.archive_receipts([r for _, r in receipts])

    def shown(self, conn: Conn, frame: p.Shown) -> None:
        """The session's agent was shown these messages: tell each sender (``shown``)."""
        sid = conn.session_id
        assert sid is not None
        self._tell([(m.sender, Receipt(m.id, Outcome.SHOWN, sid)) for m in frame.messages])

    def acknowledged(self, conn: Conn, frame: p.Acknowledge) -> None:
        """The session acknowledged these messages: tell each sender (``acknowledged``)."""
        sid = conn.session_id
        assert sid is not None
        self._tell(
            [
                (m.sender, Receipt(m.id, Outcome.ACKNOWLEDGED, sid, message=frame.note))
                for m in frame.messages
            ]
        )

    def set_wake(self, conn: Conn, wake: WakePolicy) -> SessionInfo:
        assert conn.session_id is not None
        info = self.registry.update(conn.session_id, wake=wake)
        self.relay.send_local_roster()
        return info

    def expired(self, items: list[QueuedItem], code: str = Code.EXPIRED) -> int:
        """Queued messages that will never be collected: an ``expired`` receipt each."""
        return self.expired_mail(
            [(i.recipient, Message.from_dict(i.body)) for i in items if i.kind == "message"],
            code,
        )

    def expired_mail(self, mail: list[tuple[str, Message]], code: str = Code.EXPIRED) -> int:
        """Messages (with their recipient here) that will never be collected, queued or held
        by an inbound policy: an ``expired`` receipt each for its sender."""
        receipts: list[tuple[Peer, Receipt]] = []
        outcome, code_, text = outcome_for_state(State.EXPIRED, code)
        for recipient, msg in mail:
            receipts.append((msg.sender, Receipt(msg.id, outcome, recipient, code_, text)))
            log.info("message expired", extra={"id": msg.id, "recipient": recipient})
        self._tell(receipts)
        return len(receipts)

    def forget(self, frame: p.Forget) -> p.Forgotten:
        """Drop a known session that is not live: its queued mail expires (code ``forgotten``),
        asks waiting for its reply are told so, and other hosts stop seeing it."""
        sid = frame.session
        known = self.registry.known.get(sid)
        if sid in self.registry.live:
            name = self.registry.live[sid].info.display_name
            raise ProtocolError(
                f"{name} ({sid}) is live on this host; stop what holds it (listen, wait, the "
                "MCP server) and forget it then",
                code=Code.SESSION_IN_USE,
            )
        if known is None:
            raise ProtocolError(
                f"no known session {sid} on this host (only durable sessions are kept)",
                code=Code.NOT_FOUND,
            )
        gone = self.state.forget_session(sid)
        self.registry.forget(sid)
        expired = self.expired(gone.queued, Code.FORGOTTEN)
        if self.inbound is not None:
            # Its rules and held mail are the name's: the next session to take the name
            # inherits neither, and held mail's senders learn it will not be read.
            expired += self.expired_mail(
                [(sid, m) for m in self.inbound.forget(sid)], Code.FORGOTTEN
            )
        queued_ids = {i.item_id for i in gone.queued}
        _, code, text = outcome_for_state(State.EXPIRED, Code.FORGOTTEN)
        asks = [e for e in gone.open_asks if e.ask_id not in queued_ids]
        # An asker may still wait: it learns no reply will come from this session.
        self._tell(
            [
                (
                    Peer(e.asker_id, None, e.asker_host),
                    Receipt(e.ask_id, Outcome.EXPIRED, sid, code, text),
                )
                for e in asks
            ]
        )
        self.relay.forgotten(sid)
        self.relay.send_local_roster()
        log.info("session forgotten", extra={"session": sid, "expired": expired})
        return p.Forgotten(frame.request_id, sid, known.name, expired, len(asks))
