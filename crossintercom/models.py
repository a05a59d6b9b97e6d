"""Domain values shared by the broker, the relay, the store and the clients.

Everything here is plain data: frozen ``msgspec`` structs whose field names are the JSON shapes
of the CLI contract (docs/protocol.md). The same structs travel inside wire frames, so a value
is validated once when a frame is decoded and never rebuilt by hand. ``to_dict`` and
``from_dict`` are for JSON stored outside frames (the store's payload column, inbox files).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal, Self

import msgspec

NAME_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
Name = Annotated[str, msgspec.Meta(pattern=f"^{NAME_PATTERN}$")]
# uuid5 namespace for durable session ids derived from (host id, name); fixed forever.
SESSION_NAMESPACE = uuid.UUID("6f1c2a4e-8d0b-5b7e-9a53-3c1d2e4f5a60")
Purpose = Literal["agent", "control"]
PURPOSES: Final[tuple[Purpose, ...]] = ("agent", "control")
AttachmentKind = Literal["file", "snippet", "context"]
# When a session's waiting surfaces (wait, hooks, line monitor) wake it (docs/agents.md).
WakePolicy = Literal["every", "asks", "never"]
WAKE_POLICIES: Final[tuple[WakePolicy, ...]] = ("every", "asks", "never")
ATTACHMENT_KINDS: Final[tuple[AttachmentKind, ...]] = ("file", "snippet", "context")

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

    @property
    def strength(self) -> int:
        """Rank used to pick a group's top-level outcome (the weakest receipt wins)."""
        return _STRENGTH[self]


_STRENGTH = {
    Outcome.SHOWN: 6,
    Outcome.DELIVERED: 5,
    Outcome.QUEUED: 4,
    Outcome.UNKNOWN: 3,
    Outcome.NOT_SENT: 2,
    Outcome.EXPIRED: 1,
    Outcome.REFUSED: 0,
}

UNKNOWN_ADVICE = (
    "the message may or may not have been delivered; do not resend it automatically, "
    "check with the recipient first"
)
EXPIRED_ADVICE = "not collected within the retention"
FORGOTTEN_ADVICE = "the recipient was forgotten (`crossintercom forget`) before collecting it"


def weakest(outcomes: list[Outcome]) -> Outcome:
    return min(outcomes, key=lambda o: o.strength) if outcomes else Outcome.REFUSED


def outcome_for_state(state: str, code: str | None) -> tuple[Outcome, str | None, str | None]:
    """What a store row's delivery state means to its sender: (outcome, code, message).

    The one mapping from the shared store's states (``queued``, ``delivered``, ``refused``,
    ``expired``, and ``shown`` for receipts) to outcomes. A row acknowledged with code
    ``queued`` was taken into the recipient host's durable queue (its session is away): still
    ``queued`` for the sender. An expiry keeps its code when it has one (``forgotten``).
    """
    if state == "shown":
        return Outcome.SHOWN, None, None
    if state == "delivered":
        if code == "queued":
            return Outcome.QUEUED, "queued_at_host", None
        return Outcome.DELIVERED, None, None
    if state == "queued":
        return Outcome.QUEUED, None, None
    if state == "expired":
        if code == "forgotten":
            return Outcome.EXPIRED, code, FORGOTTEN_ADVICE
        return Outcome.EXPIRED, "expired", EXPIRED_ADVICE
    return Outcome.REFUSED, code or "refused", None


def valid_name(name: str) -> bool:
    return _NAME_RE.fullmatch(name) is not None


def durable_session_id(host_id: str, name: str) -> str:
    """The id `--as NAME` stands for: the same name on the same host is the same mailbox."""
    return str(uuid.uuid5(SESSION_NAMESPACE, f"{host_id}\x00{name}"))


def new_id() -> str:
    return str(uuid.uuid4())


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fallback_alias(session_id: str) -> str:
    return f"session-{session_id.replace('-', '')[:8]}"


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


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

    def canonical_payload(self) -> bytes:
        """What identity covers: a retry must repeat exactly this (docs/delivery.md)."""
        return canonical_json(
            {
                "from": self.sender.id,
                "to": self.to,
                "message": self.text,
                "attachments": [a.to_dict() for a in self.attachments],
                "reply_to": self.reply_to,
                "expects_reply": self.expects_reply,
            }
        )

    def digest(self) -> str:
        return hashlib.sha256(self.canonical_payload()).hexdigest()

    def size(self) -> int:
        return len(self.text.encode()) + sum(
            len(a.content.encode()) + len(a.name.encode()) for a in self.attachments
        )

    def with_flags(self, *flags: str) -> Message:
        merged = tuple(dict.fromkeys((*self.flags, *flags)))
        return msgspec.structs.replace(self, flags=merged)


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
