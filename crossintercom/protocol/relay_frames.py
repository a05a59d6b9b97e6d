"""The broker <-> relay link: two tagged unions, one per direction (docs/protocol.md).

The relay is a ``control`` client of its broker. ``RelayFrame`` is what it sends (answers to
forwards, the remote roster, inbound messages, late receipts); ``ToRelayFrame`` is what the
broker sends it (messages to forward, the local roster, roster refresh requests).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from crossintercom.models import LateReceiptOutcome, Message, Peer, Receipt, SessionInfo
from crossintercom.protocol.broker_frames import Reservation
from crossintercom.protocol.client_frames import MessageId, RequestId, ReservationMode, SessionId

# What a recipient's host may report to a sender's host after the delivery was acknowledged
# (the one outcome model's, models.py).
HostReceiptOutcome = LateReceiptOutcome

# --- relay -> broker --------------------------------------------------------------------------


class RemoteRoster(msgspec.Struct, tag="remote_roster", frozen=True, omit_defaults=True):
    """The relay's copy of every other host's sessions."""

    sessions: list[SessionInfo]
    request_id: RequestId | None = None


class Inbound(msgspec.Struct, tag="inbound", frozen=True):
    """A message from the store for a local session; answered with a ``result`` frame."""

    request_id: RequestId
    message: Message
    recipient: SessionId


class InboundBatch(msgspec.Struct, tag="inbound_batch", frozen=True):
    """Messages from the store for one local session, in the store's order; answered with one
    ``inbound_result`` carrying a receipt per message, in the same order. ``repeats``: the ids
    among them that may have reached the session already, on the machine this host id moved
    from (flag ``possible_repeat``, docs/protocol.md)."""

    request_id: RequestId
    recipient: SessionId
    messages: list[Message]
    repeats: list[MessageId] = []


class InboundBatchText(msgspec.Struct, tag="inbound_batch", frozen=True, omit_defaults=True):
    """``inbound_batch`` as the relay writes it: each message as the JSON text it screened (the
    store's own, passed through), so the broker decodes exactly what the relay checked. Only
    encoded, never in a union: the broker reads it as ``InboundBatch``."""

    request_id: RequestId
    recipient: SessionId
    messages: list[msgspec.Raw]
    repeats: list[MessageId] = []


class ForwardResult(msgspec.Struct, tag="forward_result", frozen=True):
    """The relay's answer to a ``forward``: one receipt per remote recipient."""

    fid: int
    receipts: list[Receipt]


class SenderReceipt(Receipt, frozen=True, omit_defaults=True):
    """A receipt with the local session that sent the message (whom to tell)."""

    sender: str = ""


class RemoteReceipt(msgspec.Struct, tag="remote_receipt", frozen=True):
    """Receipts arriving later from other hosts for messages this host sent."""

    receipts: list[SenderReceipt]


class RosterRefreshed(msgspec.Struct, tag="roster_refreshed", frozen=True):
    fid: int


class ArchiveState(msgspec.Struct, tag="archive_state", frozen=True, omit_defaults=True):
    """Whether the store-wide archive is on: the broker sends ``archive`` copies only then.
    ``receipts``: the relay also takes ``archive_receipts`` (an older one leaves it out, and
    would drop the link on a frame it does not know)."""

    enabled: bool
    receipts: bool = False


class ReservationReply(msgspec.Struct, tag="reservation_reply", frozen=True, omit_defaults=True):
    """The relay's answer to a ``reservation_request``: as ``reservation_list`` says, or
    ``code`` and ``message`` when the store could not be asked."""

    fid: int
    items: list[Reservation] = []
    conflicts: list[Reservation] = []
    released: int = 0
    code: str | None = None
    message: str | None = None
    # Some were left out: the store held more than one answer carries (docs/protocol.md).
    more: bool = False


RelayFrame = (
    RemoteRoster
    | Inbound
    | InboundBatch
    | ForwardResult
    | RemoteReceipt
    | RosterRefreshed
    | ArchiveState
    | ReservationReply
)

# --- broker -> relay --------------------------------------------------------------------------


class Recipient(msgspec.Struct, frozen=True):
    session: str
    host: str


class Forward(msgspec.Struct, tag="forward", frozen=True):
    """A message for sessions on other hosts: the relay writes it to the store."""

    fid: int
    message: Message
    recipients: list[Recipient]


class LocalRoster(msgspec.Struct, tag="local_roster", frozen=True):
    """This host's sessions, sent on every change and when the relay registers."""

    sessions: list[SessionInfo]


class RefreshRoster(msgspec.Struct, tag="refresh_roster", frozen=True):
    """A target was not found: re-read the roster now, then answer ``roster_refreshed``."""

    fid: int


class ReceiptFor(msgspec.Struct, frozen=True, omit_defaults=True):
    """A receipt this host owes a sender on another host for a message it received."""

    id: str
    recipient: str
    sender: Peer
    outcome: HostReceiptOutcome
    code: str | None = None
    # ``acknowledged`` only: the recipient's note (docs/delivery.md#acknowledgement).
    note: str | None = None


class SendReceipts(msgspec.Struct, tag="send_receipts", frozen=True):
    """Receipts for senders on other hosts (``shown``, ``acknowledged``, and ``expired`` of
    mail held here)."""

    receipts: list[ReceiptFor]


class SessionForgotten(msgspec.Struct, tag="session_forgotten", frozen=True):
    """``forget`` dropped a local session: expire what the store still queues for it."""

    session: SessionId


class ArchiveCopy(msgspec.Struct, tag="archive", frozen=True, omit_defaults=True):
    """A message this host's sessions sent, with its receipts, for the archive. Sent after the
    sender has its outcome and never answered: archiving is off the delivery path. ``wait_s``:
    an ask's wait as its client told the broker (the sender's host only; docs/web.md)."""

    message: Message
    receipts: list[Receipt]
    wait_s: float | None = None


class ReservationRequest(
    msgspec.Struct, tag="reservation_request", frozen=True, omit_defaults=True
):
    """A session's reserve, release or list (``op``), for the relay to run against the store
    (docs/agents.md#path-reservations); answered with ``reservation_reply``. Globs arrive
    normalised (``crossintercom.reservations.normalise``)."""

    fid: int
    op: Literal["reserve", "release", "list"]
    session: SessionId
    project: str | None = None
    globs: list[str] | None = None
    mode: ReservationMode = "exclusive"
    ttl_s: float = 3600.0
    reason: str | None = None


class ArchiveReceipt(msgspec.Struct, frozen=True, omit_defaults=True):
    """A later outcome of a message delivered to a session on this host."""

    id: str
    recipient: str
    outcome: str
    code: str | None = None


class ArchiveReceipts(msgspec.Struct, tag="archive_receipts", frozen=True):
    """Receipts this host produced after the delivery (``shown``, ``acknowledged``,
    ``expired``), for the archive: the only way one between two other hosts reaches a page
    elsewhere (docs/archive.md). Sent only to a relay whose ``archive_state`` said
    ``receipts``; never answered."""

    receipts: list[ArchiveReceipt]


ToRelayFrame = (
    Forward
    | LocalRoster
    | RefreshRoster
    | SendReceipts
    | SessionForgotten
    | ArchiveCopy
    | ReservationRequest
    | ArchiveReceipts
)
