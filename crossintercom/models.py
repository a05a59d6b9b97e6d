"""Domain values shared by the broker, the relay, the store and the clients.

Everything here is plain data: frozen ``msgspec`` structs whose field names are the JSON shapes
of the CLI contract (docs/protocol.md). The same structs travel inside wire frames, so a value
is validated once when a frame is decoded and never rebuilt by hand. ``to_dict`` and
``from_dict`` are for JSON stored outside frames (the store's payload column, inbox files).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal, Self, get_args

import msgspec

from crossintercom.codes import Code

NAME_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
Name = Annotated[str, msgspec.Meta(pattern=f"^{NAME_PATTERN}$")]
# How many groups one session may be in: every `list` and `groups` answer carries them all.
MAX_GROUPS: Final = 32
# What a session says of itself is in every host's `list` answers: bounded (docs/protocol.md).
CWD_CHARS, DESCRIPTION_CHARS = 4096, 1000
Cwd = Annotated[str, msgspec.Meta(max_length=CWD_CHARS, pattern="^[^\x00]*$")]  # NUL: no text
Description = Annotated[str, msgspec.Meta(max_length=DESCRIPTION_CHARS, pattern="^[^\x00]*$")]
# uuid5 namespace for durable session ids derived from (host id, name); fixed forever.
SESSION_NAMESPACE = uuid.UUID("6f1c2a4e-8d0b-5b7e-9a53-3c1d2e4f5a60")
Purpose = Literal["agent", "control"]
PURPOSES: Final[tuple[Purpose, ...]] = ("agent", "control")
AttachmentKind = Literal["file", "snippet", "context"]
# When a session's waiting surfaces (wait, hooks, line monitor) wake it (docs/agents.md).
WakePolicy = Literal["every", "asks", "urgent", "never"]
WAKE_POLICIES: Final[tuple[WakePolicy, ...]] = ("every", "asks", "urgent", "never")
# How much a message matters to its sender (docs/delivery.md#priority); a backlog is shown
# most urgent first.
Priority = Literal["low", "normal", "high", "urgent"]
PRIORITIES: Final[tuple[Priority, ...]] = ("low", "normal", "high", "urgent")
PRIORITY_RANK: Final[dict[str, int]] = {p: i for i, p in enumerate(PRIORITIES)}
ATTACHMENT_KINDS: Final[tuple[AttachmentKind, ...]] = ("file", "snippet", "context")
# An acknowledgement's note, one line for the sender (docs/delivery.md#acknowledgement); the
# store's receipts hold at most this many characters of it.
ACK_NOTE_CHARS: Final = 1000

_NAME_RE = re.compile(NAME_PATTERN)
_encoder = msgspec.json.Encoder()


class Outcome(StrEnum):
    """Every outcome the code reports, to a sender or in a later receipt (docs/delivery.md)."""

    DELIVERED = "delivered"
    QUEUED = "queued"
    REFUSED = "refused"
    NOT_SENT = "not_sent"
    UNKNOWN = "unknown"
    # Receipts only: the message waited out the retention without being collected.
    EXPIRED = "expired"
    # Receipts only, after ``delivered``: a surface showed it to the recipient's agent.
    SHOWN = "shown"
    # Receipts only: the recipient acknowledged it (docs/delivery.md#acknowledgement).
    ACKNOWLEDGED = "acknowledged"

    @property
    def strength(self) -> int:
        """Rank used to pick a group's top-level outcome (the weakest receipt wins)."""
        return _STRENGTH[self]


_STRENGTH = {
    Outcome.ACKNOWLEDGED: 7,
    Outcome.SHOWN: 6,
    Outcome.DELIVERED: 5,
    Outcome.QUEUED: 4,
    Outcome.UNKNOWN: 3,
    Outcome.NOT_SENT: 2,
    Outcome.EXPIRED: 1,
    Outcome.REFUSED: 0,
}

# The outcomes, in the one order every surface merges a recipient's receipts by (the archive,
# the overseer feed, the store's SQL): an outcome only moves further along, and a failure ends
# it (docs/delivery.md, "How far along"). Not ``strength`` (which outcome of a group to report).
PROGRESS: Final[dict[str, int]] = {
    Outcome.UNKNOWN: 0,
    Outcome.QUEUED: 1,
    Outcome.DELIVERED: 2,
    Outcome.SHOWN: 3,
    Outcome.ACKNOWLEDGED: 4,
    Outcome.REFUSED: 5,
    Outcome.EXPIRED: 5,
    Outcome.NOT_SENT: 5,
}


def progress(outcome: str) -> int:
    """How far along ``outcome`` is (``PROGRESS``); a word that is no outcome counts as
    ``unknown``."""
    return PROGRESS.get(outcome, 0)


def further(new: str, old: str) -> bool:
    """Whether outcome ``new`` replaces ``old`` for the same recipient."""
    return progress(new) > progress(old)


# The failures: the end of the order, nothing follows them.
FAILED: Final = frozenset(o for o, rank in PROGRESS.items() if rank == max(PROGRESS.values()))
# Outcomes that never move again: the failures, and an acknowledgement (the last a recipient
# can do).
SETTLED: Final = FAILED | {Outcome.ACKNOWLEDGED}


# A shared-store delivery row's state: queued until acknowledged (delivered, refused) or
# expired; the store's CHECK constraint lists the same (storage/schema).
DeliveryState = Literal["queued", "delivered", "refused", "expired"]
DELIVERY_STATES: Final[tuple[DeliveryState, ...]] = get_args(DeliveryState)
# The outcomes each kind of row or frame may carry, spelt as types once, here; the tuples are
# read from them (tests/unit/test_outcome_model.py holds every member to ``Outcome``).
# A delivery's ack by its recipient's host.
AckOutcome = Literal["delivered", "refused"]
# A store's receipt row.
ReceiptOutcome = Literal["delivered", "refused", "expired", "shown", "acknowledged"]
# What a recipient's host reports to a sender's host after its ack (``add_receipts``, the
# relays' receipt frame).
LateReceiptOutcome = Literal["shown", "expired", "acknowledged"]
RECEIPT_OUTCOMES: Final[tuple[ReceiptOutcome, ...]] = get_args(ReceiptOutcome)
LATE_RECEIPT_OUTCOMES: Final[tuple[LateReceiptOutcome, ...]] = get_args(LateReceiptOutcome)

UNKNOWN_ADVICE = (
    "the message may or may not have been delivered; do not resend it automatically, "
    "check with the recipient first"
)
EXPIRED_ADVICE = "not collected within the retention"
FORGOTTEN_ADVICE = "the recipient was forgotten (`crossintercom forget`) before collecting it"
# What a sender is told of a refusal that reached it as a store row: the row carries a code and
# no text (the receiving host's own words stay there), so the words are the sender's, one per
# code a receiving host or the store writes; the same words as a same-host refusal where there
# is one (docs/delivery.md, "Outcomes").
REFUSAL_ADVICE: Final[dict[str, str]] = {
    Code.SENDER_REFUSED: "the recipient does not take mail from this sender",
    Code.RATE_LIMITED: "the recipient's host refuses this sender for now: over its message rate",
    Code.REPLY_NOT_AUTHORISED: "that ask was not sent to this sender",
    Code.ALREADY_REPLIED: "that ask was already answered",
    Code.NOT_FOUND: "no such session on the recipient's host",
    Code.ASKER_GONE: "the asking session has left and keeps no mailbox",
    Code.UNDELIVERABLE: "the recipient's host could not hand it over in repeated tries",
    Code.FORGED_SENDER: "the recipient's host refused a sender the sending host may not use",
    Code.BAD_MESSAGE: "the recipient's host could not read the stored message",
    Code.TOO_LARGE: "the message is over the store's or the recipient host's size limit",
    Code.ID_CONFLICT: "another host's message already has this id",
    Code.PAYLOAD_CONFLICT: "a different message was already sent with this id",
}
REFUSED_ADVICE = "the recipient's host refused it"


def weakest(outcomes: list[Outcome]) -> Outcome:
    return min(outcomes, key=lambda o: o.strength) if outcomes else Outcome.REFUSED


class State(StrEnum):
    """A shared-store delivery row's state (``shown``: a receipt row's). Not an outcome (what
    its sender is told: ``outcome_for_state``) nor a code (why: the row's reason)."""

    QUEUED = "queued"
    DELIVERED = "delivered"
    REFUSED = "refused"
    EXPIRED = "expired"
    SHOWN = "shown"
    ACKNOWLEDGED = "acknowledged"


def outcome_for_state(state: str, code: str | None) -> tuple[Outcome, str | None, str | None]:
    """What a store row's delivery state means to its sender: (outcome, code, message).

    The one mapping from ``State`` to outcomes. A row acknowledged with ``Code.HOST_QUEUED`` was
    taken into the recipient host's durable queue (its session is away): still ``queued`` for
    the sender. An expiry keeps its code when it has one (``forgotten``).
    """
    if state == State.SHOWN:
        return Outcome.SHOWN, None, None
    if state == State.ACKNOWLEDGED:
        return Outcome.ACKNOWLEDGED, None, None
    if state == State.DELIVERED:
        if code == Code.HOST_QUEUED:
            return Outcome.QUEUED, Code.QUEUED_AT_HOST, None
        return Outcome.DELIVERED, None, None
    if state == State.QUEUED:
        return Outcome.QUEUED, None, None
    if state == State.EXPIRED:
        if code == Code.FORGOTTEN:
            return Outcome.EXPIRED, code, FORGOTTEN_ADVICE
        return Outcome.EXPIRED, Code.EXPIRED, EXPIRED_ADVICE
    code = code or Code.REFUSED
    return Outcome.REFUSED, code, REFUSAL_ADVICE.get(code, REFUSED_ADVICE)


# What ``valid_name`` asks of a session or group name, in words for an error message.
NAME_RULE = (
    "use letters, digits, '.', '_' or '-', starting with a letter or digit, at most 64 characters"
)


def valid_name(name: str) -> bool:
    return _NAME_RE.fullmatch(name) is not None


def durable_session_id(host_id: str, name: str) -> str:
    """The id `--as NAME` stands for: the same name on the same host is the same mailbox."""
    return str(uuid.uuid5(SESSION_NAMESPACE, f"{host_id}\x00{name}"))


def _derived_shape(session_id: str) -> bool:
    """Whether ``session_id`` reads as a name-based (version 5) UUID, the shape of a durable
    id: such an id is only ever its own host's to claim."""
    try:
        return uuid.UUID(session_id).version == 5
    except ValueError:
        return False


def rightful_claims(
    sessions: Sequence[SessionInfo],
) -> tuple[list[SessionInfo], list[SessionInfo]]:
    """Roster rows as (kept, dropped): a row whose id has the shape of a durable id but is not
    the one its host and name derive is dropped (durable or not: mail by id would go to it),
    and so is every claim of an id two hosts claim (never the first or the last: order decides
    nothing). An explicit ``--session-id`` of another shape is its first claimer's (the store's
    unique index). docs/operations.md, "Trust model"."""
    rows = [
        s
        for s in sessions
        if not _derived_shape(s.id)
        or (s.name is not None and s.id == durable_session_id(s.host, s.name))
    ]
    owners: dict[str, set[str]] = {}
    for s in rows:
        owners.setdefault(s.id, set()).add(s.host)
    kept = [s for s in rows if len(owners[s.id]) == 1]
    ok = {id(s) for s in kept}
    return kept, [s for s in sessions if id(s) not in ok]


def new_id() -> str:
    return str(uuid.uuid4())


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fallback_alias(session_id: str) -> str:
    return f"session-{session_id.replace('-', '')[:8]}"


# Sorted keys, no spaces, UTF-8 unescaped: byte for byte what ``json.dumps(obj, sort_keys=True,
# separators=(",", ":"), ensure_ascii=False).encode()`` gives (a unit test holds them equal), so
# digests and dedup records written before stay valid; msgspec takes a fraction of the time.
_canonical_encoder = msgspec.json.Encoder(order="sorted")


def canonical_json(obj: Any) -> bytes:
    return _canonical_encoder.encode(obj)


class _Value(msgspec.Struct, frozen=True):
    """JSON conversions shared by every value below."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.json.decode(_encoder.encode(self))
        return out

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        """Validate plain JSON data; raises ``msgspec.ValidationError`` (a ``ValueError``)."""
        return msgspec.convert(d, cls)


class Attachment(_Value, frozen=True, omit_defaults=True):
    kind: str
    name: str
    content: str
    language: str | None = None


class Peer(_Value, frozen=True):
    """Who sent a message."""

    id: str
    name: str | None
    host: str


class Message(_Value, frozen=True, tag_field="type", tag="message"):
    id: str
    sender: Peer = msgspec.field(name="from")
    to: str = ""
    text: str = msgspec.field(name="message", default="")
    attachments: tuple[Attachment, ...] = ()
    reply_to: str | None = None
    expects_reply: bool = False
    sent_at: str = msgspec.field(default_factory=now_iso)
    flags: tuple[str, ...] = ()
    # A conversation's headline, set by its sender; a reply inherits its ask's (docs/threads.md).
    subject: str | None = None
    # The root message's id: a reply inherits its ask's thread, a new message starts its own.
    thread_id: str | None = None
    priority: Priority = "normal"
    # The sender asks for an explicit acknowledgement (docs/delivery.md#acknowledgement),
    # overdue after ``ack_by`` (ISO time) when set.
    ack_required: bool = False
    ack_by: str | None = None

    def __post_init__(self) -> None:
        # Every message has a thread, also one saved before threads existed.
        if self.thread_id is None:
            msgspec.structs.force_setattr(self, "thread_id", self.id)

    @property
    def thread(self) -> str:
        return self.thread_id or self.id

    def canonical_payload(self) -> bytes:
        """What identity covers: a retry must repeat exactly this (docs/delivery.md).

        The subject, a priority other than ``normal`` and an acknowledgement request count when
        there are; absent, the payload (and so every digest made before they existed) is
        unchanged. The thread is derived, not sent, so it is out.
        """
        payload: dict[str, Any] = {
            "from": self.sender.id,
            "to": self.to,
            "message": self.text,
            # Encoded as structs: sorted fields, defaults omitted, as their to_dict() has.
            "attachments": self.attachments,
            "reply_to": self.reply_to,
            "expects_reply": self.expects_reply,
        }
        if self.subject is not None:
            payload["subject"] = self.subject
        if self.priority != "normal":
            payload["priority"] = self.priority
        if self.ack_required:
            payload["ack_required"] = True
            if self.ack_by is not None:
                payload["ack_by"] = self.ack_by
        return canonical_json(payload)

    def digest(self) -> str:
        return hashlib.sha256(self.canonical_payload()).hexdigest()

    def size(self) -> int:
        return (
            len(self.text.encode())
            + len((self.subject or "").encode())
            + sum(len(a.content.encode()) + len(a.name.encode()) for a in self.attachments)
        )

    def with_flags(self, *flags: str) -> Message:
        merged = tuple(dict.fromkeys((*self.flags, *flags)))
        return msgspec.structs.replace(self, flags=merged)


# A message handed over after its host id moved here from another machine that may already
# have delivered it (docs/protocol.md, flags): the agent is told it may be a repeat.
POSSIBLE_REPEAT: Final = "possible_repeat"


# What `list` and the MCP `list_sessions` tool show of each session (one list for both).
LISTED_SESSION_FIELDS = (
    "id",
    "name",
    "host",
    "cwd",
    "model",
    "status",
    "purpose",
    "groups",
    "online",
    "wake",
)


class SessionInfo(_Value, frozen=True):
    id: str
    host: str
    name: str | None = None
    # The name shown for the session: its name, else a runtime-only fallback (never stored).
    alias: str = ""
    cwd: str | None = None
    model: str | None = None
    status: str | None = None
    purpose: Purpose = "agent"
    groups: tuple[str, ...] = ("default",)
    durable: bool = False
    online: bool = True
    wake: WakePolicy = "every"

    def __post_init__(self) -> None:
        if not self.alias:
            msgspec.structs.force_setattr(self, "alias", self.name or fallback_alias(self.id))

    @property
    def display_name(self) -> str:
        return self.alias


class Receipt(_Value, frozen=True, omit_defaults=True):
    """One recipient's outcome for a message (``host``: the recipient's, for remote ones)."""

    id: str
    outcome: Outcome
    recipient: str | None = None
    code: str | None = None
    message: str | None = None
    host: str | None = None

    @property
    def key(self) -> str:
        """Identifies one receipt across resends: message, recipient and outcome."""
        return f"{self.id}:{self.recipient or ''}:{self.outcome.value}"


class SendResult(_Value, frozen=True, omit_defaults=True):
    """What a sender is told. ``receipts`` is set for group targets, ``reply`` by ``ask``."""

    id: str
    outcome: Outcome
    code: str | None = None
    message: str | None = None
    receipts: tuple[Receipt, ...] | None = None
    # A reply's result: the ask it answered (on the wire; the CLI prints only id and outcome).
    reply_to: str | None = None
    reply: Message | None = None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d.pop("reply_to", None)
        d.pop("reply", None)  # the CLI adds it where the contract has it (ask)
        if self.message is None and self.outcome is Outcome.UNKNOWN:
            d["message"] = UNKNOWN_ADVICE
        return d

    @classmethod
    def refused(cls, message_id: str, code: str, message: str) -> SendResult:
        return cls(message_id, Outcome.REFUSED, code, message)

    @classmethod
    def from_receipt(cls, receipt: Receipt, **extra: Any) -> SendResult:
        return cls(receipt.id, receipt.outcome, receipt.code, receipt.message, **extra)


# --- search (docs/archive.md) -------------------------------------------------------------------
