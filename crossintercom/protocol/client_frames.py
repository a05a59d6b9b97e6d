"""Frames a client sends its broker (one tagged union, ``ClientFrame``; docs/protocol.md)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from crossintercom.models import (
    ACK_NOTE_CHARS,
    MAX_GROUPS,
    Cwd,
    Description,
    Name,
    Peer,
    Priority,
    WakePolicy,
)
from crossintercom.reservations import Mode

SessionId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
MessageId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
# The id a new message or session takes, and the thread it names: no control character (a
# PostgreSQL text column cannot hold NUL, and a header cannot show a line break),
# docs/protocol.md.
_NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]+$"
NewId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=_NO_CONTROL)]
RequestId = Annotated[int, msgspec.Meta(ge=0)]
# At most this many ids in one frame's list (a client sends a handful).
MAX_IDS = 10_000
# One line of headline; longer text belongs in the message.
Subject = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class AttachmentBody(msgspec.Struct, frozen=True, omit_defaults=True):
    kind: str
    name: str
    content: str
    language: str | None = None


class SessionBody(msgspec.Struct, frozen=True, omit_defaults=True):
    id: NewId
    name: Name | None = None
    cwd: Cwd | None = None
    model: Description | None = None
    status: Description | None = None
    # Checked by the broker, not here, so a wrong purpose gets its own code.
    purpose: str = "agent"
    groups: Annotated[list[Name], msgspec.Meta(max_length=MAX_GROUPS)] | None = None
    durable: bool = False


class OutgoingBody(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a sender supplies; the broker adds sender and time."""

    id: NewId
    message: str
    to: str | None = None
    attachments: list[AttachmentBody] = []
    reply_to: MessageId | None = None
    expects_reply: bool = False
    subject: Subject | None = None
    # Continue this thread (a root message's id); absent, the message starts its own, and a
    # reply takes its ask's.
    thread_id: NewId | None = None
    priority: Priority = "normal"
    ack_required: bool = False
    # The acknowledgement's deadline (ISO time), set by the client so a retry repeats it.
    ack_by: str | None = None


class Register(msgspec.Struct, tag="register", frozen=True):
    request_id: RequestId
    protocol: int
    session: SessionBody
    # "own": this connection becomes the session's owner (listen); "auto": attach to the live
    # owner if there is one, else own it for the life of the connection (one-shot commands).
    # Checked by the broker so a wrong mode gets a readable message.
    mode: str = "own"
    # Ids of asks this session made that the connection still waits on (after a reconnect).
    awaiting: Annotated[list[MessageId], msgspec.Meta(max_length=MAX_IDS)] = []


class Send(msgspec.Struct, tag="send", frozen=True, omit_defaults=True):
    """send and ask (``expects_reply``) share one frame."""

    request_id: RequestId
    message: OutgoingBody
    # How long an ask's client waits for the reply: only shown on the overseer page, never
    # part of the message (its digest) nor of delivery. Absent from older clients; ignored by
    # older brokers (docs/web.md, "Needs attention").
    wait_s: float | None = None


class Reply(msgspec.Struct, tag="reply", frozen=True):
    request_id: RequestId
    message: OutgoingBody


class Ack(msgspec.Struct, tag="ack", frozen=True, omit_defaults=True):
    """The recipient's client saved the message (or receipt notice) to its durable inbox."""

    id: MessageId
    refused: str | None = None


class Confirm(msgspec.Struct, tag="confirm", frozen=True):
    """The sender has these outcomes; the broker may discard their dedup records."""

    ids: Annotated[list[MessageId], msgspec.Meta(max_length=MAX_IDS)]


class ListSessions(msgspec.Struct, tag="list", frozen=True):
    request_id: RequestId


class Status(msgspec.Struct, tag="status", frozen=True):
    request_id: RequestId


class Groups(msgspec.Struct, tag="groups", frozen=True):
    request_id: RequestId


class Join(msgspec.Struct, tag="join", frozen=True):
    request_id: RequestId
    group: Name


class Leave(msgspec.Struct, tag="leave", frozen=True):
    request_id: RequestId
    group: Name


class Counts(msgspec.Struct, tag="counts", frozen=True):
    """Host-wide: the relay's metrics ask it every few seconds; two counts, no health checks."""

    request_id: RequestId


class SetStatus(msgspec.Struct, tag="set_status", frozen=True):
    request_id: RequestId
    status: Description | None


class Pending(msgspec.Struct, tag="pending", frozen=True):
    request_id: RequestId


class Ping(msgspec.Struct, tag="ping", frozen=True):
    request_id: RequestId


class ShownItem(msgspec.Struct, frozen=True):
    """One message a surface showed: its id and its sender, as the inbox holds them."""

    id: MessageId
    sender: Peer


class Shown(msgspec.Struct, tag="shown", frozen=True):
    """The session's agent was shown these messages; the broker tells their senders."""

    messages: list[ShownItem]


class Acknowledge(msgspec.Struct, tag="acknowledge", frozen=True, omit_defaults=True):
    """The session acknowledges these messages; the broker tells their senders
    (docs/delivery.md#acknowledgement). A notice, like ``shown``: no answer."""

    messages: list[ShownItem]
    note: Annotated[str, msgspec.Meta(max_length=ACK_NOTE_CHARS)] | None = None


class AckWaits(msgspec.Struct, tag="ack_waits", frozen=True):
    """What this session sent with an acknowledgement request, and what became of it."""

    request_id: RequestId


class DeadLetters(msgspec.Struct, tag="dead_letters", frozen=True):
    """Messages this session sent that never reached their recipient (``everyone``: every
    session's of this host); docs/delivery.md#dead-letters."""

    request_id: RequestId
    everyone: bool = False


class Resend(msgspec.Struct, tag="resend", frozen=True):
    """Send a dead letter again as a new message ``new_id`` in the same thread."""

    request_id: RequestId
    id: MessageId
    new_id: NewId
    recipient: str | None = None


class InboundPolicy(msgspec.Struct, tag="inbound_policy", frozen=True, omit_defaults=True):
    """Read the session's inbound policy and held mail; with ``pattern``, first set its rule
    (``action`` accept, hold or refuse; None removes it); with ``release``, first release
    those held messages (``["*"]``: all). docs/agents.md#inbound-policy."""

    request_id: RequestId
    pattern: str | None = None
    action: str | None = None
    release: list[MessageId] | None = None


# A project key (docs/agents.md#path-reservations): a normalised remote URL or a name.
Project = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
Glob = Annotated[str, msgspec.Meta(min_length=1, max_length=500)]
ReservationMode = Mode  # reservations.Mode, the one definition


class Reserve(msgspec.Struct, tag="reserve", frozen=True, omit_defaults=True):
    """Reserve ``globs`` of ``project`` for this session, all or none, for ``ttl_s``; answered
    with ``reservation_list`` (its ``code`` says a clash, and ``conflicts`` with what)."""

    request_id: RequestId
    project: Project
    globs: Annotated[list[Glob], msgspec.Meta(min_length=1, max_length=100)]
    mode: ReservationMode = "exclusive"
    ttl_s: Annotated[float, msgspec.Meta(gt=0, le=30 * 86400)] = 3600.0
    reason: Annotated[str, msgspec.Meta(max_length=500)] | None = None


class Unreserve(msgspec.Struct, tag="unreserve", frozen=True, omit_defaults=True):
    """Release this session's reservations of ``project``: those of ``globs``, else all."""

    request_id: RequestId
    project: Project
    globs: Annotated[list[Glob], msgspec.Meta(max_length=100)] | None = None


class Reservations(msgspec.Struct, tag="reservations", frozen=True, omit_defaults=True):
    """The live reservations of ``project`` (absent: of every project), every host's."""

    request_id: RequestId
    project: Project | None = None


class SetWake(msgspec.Struct, tag="set_wake", frozen=True):
    """The session's wake policy, kept with a durable session (docs/agents.md#wake-policy)."""

    request_id: RequestId
    wake: WakePolicy


class Forget(msgspec.Struct, tag="forget", frozen=True):
    """Drop a known (durable) session of this host: its queued mail expires (docs/agents.md)."""

    request_id: RequestId
    session: SessionId


class InboxFaultItem(msgspec.Struct, frozen=True):
    """One way the session's inbox fails: reading or writing, since when (Unix time), why."""

    op: Literal["read", "write"]
    since: float
    error: Annotated[str, msgspec.Meta(max_length=500)]


class InboxFault(msgspec.Struct, tag="inbox_fault", frozen=True):
    """The client's inbox fails now (empty: it works again); ``status`` shows it for as long as
    this connection says so (docs/reliability.md, "A session's inbox fails")."""

    faults: Annotated[list[InboxFaultItem], msgspec.Meta(max_length=2)]


class Traffic(msgspec.Struct, tag="traffic", frozen=True):
    """What this host's sessions sent and received lately, after the event ``after`` (the
    broker's bounded in-memory log; the overseer page reads it, docs/web.md)."""

    request_id: RequestId
    after: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=5000)] = 1000


ClientFrame = (
    Register
    | Send
    | Reply
    | Ack
    | Confirm
    | ListSessions
    | Status
    | Counts
    | Groups
    | Join
    | Leave
    | SetStatus
    | Pending
    | Ping
    | Shown
    | SetWake
    | Forget
    | InboxFault
    | Traffic
    | Acknowledge
    | AckWaits
    | DeadLetters
    | Resend
    | InboundPolicy
    | Reserve
    | Unreserve
    | Reservations
)

# Frames a connection may send before it registers: queries that need no identity
# (docs/protocol.md) and the acknowledgements that never act on anyone's behalf.
ANONYMOUS_TYPES: frozenset[str] = frozenset(
    {"register", "list", "status", "groups", "ping", "confirm", "forget"}
)
# Frames that act as a mailbox; a control session (the relay) is not one.
MAILBOX_TYPES: frozenset[str] = frozenset(
    {
        "send",
        "reply",
        "join",
        "leave",
        "pending",
        "shown",
        "set_wake",
        "inbox_fault",
        "acknowledge",
        "ack_waits",
        "dead_letters",
        "resend",
        "inbound_policy",
        "reserve",
        "unreserve",
        "reservations",
    }
)
