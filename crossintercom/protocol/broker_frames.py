"""Frames a broker sends its clients (one tagged union, ``BrokerFrame``; docs/protocol.md)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from crossintercom.models import Message, Outcome, Receipt, SendResult, SessionInfo
from crossintercom.protocol.client_frames import OutgoingBody, RequestId


class Error(msgspec.Struct, tag="error", frozen=True, omit_defaults=True):
    """A frame could not be served; ``code`` is one of ``errors.Code``."""

    code: str
    message: str
    request_id: RequestId | None = None


class Registered(msgspec.Struct, tag="registered", frozen=True, omit_defaults=True):
    request_id: RequestId
    attached: bool
    # The session as the broker holds it (absent for a control session).
    session: SessionInfo | None = None


class Result(msgspec.Struct, tag="result", frozen=True, omit_defaults=True):
    """The outcome of a send, ask or reply; also the broker's answer to an ``inbound``."""

    request_id: RequestId
    id: str
    outcome: Outcome
    code: str | None = None
    message: str | None = None
    receipts: list[Receipt] | None = None
    reply_to: str | None = None
    recipient: str | None = None

    @classmethod
    def of(cls, request_id: int, result: SendResult) -> Result:
        receipts = list(result.receipts) if result.receipts is not None else None
        return cls(
            request_id,
            result.id,
            result.outcome,
            result.code,
            result.message,
            receipts,
            reply_to=result.reply_to,
        )

    @classmethod
    def of_receipt(cls, request_id: int, receipt: Receipt) -> Result:
        return cls(
            request_id,
            receipt.id,
            receipt.outcome,
            receipt.code,
            receipt.message,
            recipient=receipt.recipient,
        )

    def send_result(self) -> SendResult:
        receipts = tuple(self.receipts) if self.receipts is not None else None
        return SendResult(
            self.id, self.outcome, self.code, self.message, receipts, reply_to=self.reply_to
        )


class InboundResult(msgspec.Struct, tag="inbound_result", frozen=True):
    """The broker's answer to an ``inbound_batch``: one receipt per message, in its order."""

    request_id: RequestId
    receipts: list[Receipt]


class Deliver(msgspec.Struct, tag="deliver", frozen=True, omit_defaults=True):
    """A message for this session; the client saves it, then sends ``ack``."""

    message: Message
    # Answers an ask this session made: the client returns it to the waiting call.
    reply: bool = False


class Notice(msgspec.Struct, tag="notice", frozen=True):
    """A receipt for a message this session sent; acknowledged by ``key`` once saved."""

    key: str
    receipt: Receipt
    kind: Literal["receipt"] = "receipt"


class Sessions(msgspec.Struct, tag="sessions", frozen=True):
    request_id: RequestId
    sessions: list[SessionInfo]


class RelayState(msgspec.Struct, frozen=True):
    connected: bool
    store: str | None


class DedupStats(msgspec.Struct, frozen=True):
    records: int
    bytes: int


class StatusReport(msgspec.Struct, tag="status", frozen=True):
    request_id: RequestId
    host_id: str
    pid: int
    uptime_s: float
    sessions: int
    remote_sessions: int
    relay: RelayState
    queued: int
    dedup: DedupStats
    # Degraded states (disk full, an inbox unwritable or unreadable), one line each; [] if healthy.
    warnings: list[str] = []
    # Asks whose asker is connected and waiting here for the reply.
    asks_waiting: int = 0
    # Sessions with an inbound policy: name -> {"rules": {pattern: action}, "held": count}.
    inbound: dict[str, dict[str, Any]] = {}


class CountsReport(msgspec.Struct, tag="counts", frozen=True):
    """What the broker keeps that the store does not count, for the relay's metrics: mail its
    sessions' inbound policies hold and dead letters not resent (docs/operations.md)."""

    request_id: RequestId
    held: int
    dead_letters: int


class GroupMember(msgspec.Struct, frozen=True):
    id: str
    name: str
    host: str
    online: bool


class Group(msgspec.Struct, frozen=True):
    name: str
    members: list[GroupMember]


class GroupList(msgspec.Struct, tag="groups", frozen=True):
    request_id: RequestId
    groups: list[Group]


class PendingList(msgspec.Struct, tag="pending", frozen=True):
    """Asks delivered to this session that still wait for its reply, oldest first."""

    request_id: RequestId
    messages: list[Message]


class Ok(msgspec.Struct, tag="ok", frozen=True, omit_defaults=True):
    request_id: RequestId
    # join / leave: the session's groups afterwards.
    groups: list[str] | None = None


class Forgotten(msgspec.Struct, tag="forgotten", frozen=True):
    """``forget`` done: how many queued messages expired and asks waiting on it were dropped."""

    request_id: RequestId
    id: str
    name: str | None
    expired: int
    dropped_asks: int


class Pong(msgspec.Struct, tag="pong", frozen=True):
    request_id: RequestId
    host: str
    pid: int


class TrafficReceipt(msgspec.Struct, frozen=True, omit_defaults=True):
    """One recipient's outcome as the broker saw it pass, with the name it knew then."""

    outcome: Outcome
    recipient: str | None = None
    name: str | None = None
    host: str | None = None
    code: str | None = None
    message: str | None = None


class TrafficEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """A message this host sent, received or refused (``message`` set), or later receipts
    for one (``message`` absent). ``at``: the broker's clock, Unix seconds."""

    seq: int
    at: float
    id: str
    receipts: list[TrafficReceipt] = []
    message: Message | None = None
    # An ask's client's wait for the reply, when its ``send`` frame said (``Send.wait_s``).
    wait_s: float | None = None


class TrafficLog(msgspec.Struct, tag="traffic", frozen=True):
    """The answer to ``traffic``: events after the asked one, oldest first. ``first`` is the
    oldest event still held (older ones were dropped from the bounded log); ``last`` the newest
    so far, to ask after next time."""

    request_id: RequestId
    events: list[TrafficEvent]
    first: int
    last: int


class AckWait(msgspec.Struct, frozen=True, omit_defaults=True):
    """A message sent with an acknowledgement request: when, to whom, its deadline, and the
    acknowledgement once it came (docs/delivery.md#acknowledgement)."""

    id: str
    to: str
    sent_at: float
    ack_by: str | None = None
    acknowledged_at: float | None = None
    by: str | None = None
    note: str | None = None


class AckWaitList(msgspec.Struct, tag="ack_wait_list", frozen=True):
    request_id: RequestId
    items: list[AckWait]


class DeadLetter(msgspec.Struct, frozen=True, omit_defaults=True):
    """A message that never reached ``recipient``: why, when, and what it said."""

    id: str
    sender: str
    to: str
    recipient: str
    outcome: str
    at: float
    message: OutgoingBody
    code: str | None = None
    reason: str | None = None
    resent_as: str | None = None


class DeadLetterList(msgspec.Struct, tag="dead_letter_list", frozen=True):
    request_id: RequestId
    items: list[DeadLetter]


class HeldMail(msgspec.Struct, frozen=True):
    id: str
    sender: str
    held_at: float
    message: str


class InboundState(msgspec.Struct, tag="inbound_state", frozen=True):
    """A session's inbound rules (pattern -> action) and the mail they hold."""

    request_id: RequestId
    rules: dict[str, str]
    held: list[HeldMail]
    released: int = 0


class Reservation(msgspec.Struct, frozen=True, omit_defaults=True):
    """A live path reservation: its project and glob, how it is held, by whom (session id, name
    and host), why, and when it was made and lapses (Unix seconds)."""

    id: str
    project: str
    glob: str
    mode: str
    host: str
    session: str
    created: float
    expires_at: float
    name: str | None = None
    reason: str | None = None


class ReservationList(msgspec.Struct, tag="reservation_list", frozen=True, omit_defaults=True):
    """The answer to ``reserve`` (the session's reservations of the project after it),
    ``unreserve`` (how many were ``released``, and the rest) and ``reservations`` (every live
    one). A refused reserve has ``code`` ``reservation_conflict`` and the ``conflicts``."""

    request_id: RequestId
    items: list[Reservation]
    conflicts: list[Reservation] = []
    released: int = 0
    code: str | None = None
    message: str | None = None
    # Some were left out: the store held more than one answer carries (docs/protocol.md).
    more: bool = False


BrokerFrame = (
    Error
    | Registered
    | Result
    | InboundResult
    | Deliver
    | Notice
    | Sessions
    | StatusReport
    | CountsReport
    | GroupList
    | PendingList
    | Ok
    | Pong
    | Forgotten
    | TrafficLog
    | AckWaitList
    | DeadLetterList
    | InboundState
    | ReservationList
)
