"""Domain values shared by the broker, the relay, the store and the clients.

Everything here is plain data: frozen dataclasses with ``to_dict``/``from_dict`` that produce and
accept the JSON shapes of DESIGN §8. Validation of untrusted input lives in ``protocol``.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# uuid5 namespace for durable session ids derived from (host id, name); fixed forever.
SESSION_NAMESPACE = uuid.UUID("6f1c2a4e-8d0b-5b7e-9a53-3c1d2e4f5a60")
PURPOSES = ("agent", "control")
ATTACHMENT_KINDS = ("file", "snippet", "context")


class Outcome(StrEnum):
    DELIVERED = "delivered"
    QUEUED = "queued"
    REFUSED = "refused"
    NOT_SENT = "not_sent"
    UNKNOWN = "unknown"

    @property
    def strength(self) -> int:
        """Rank used to pick a group's top-level outcome (the weakest receipt wins)."""
        return _STRENGTH[self]


_STRENGTH = {
    Outcome.DELIVERED: 4,
    Outcome.QUEUED: 3,
    Outcome.UNKNOWN: 2,
    Outcome.NOT_SENT: 1,
    Outcome.REFUSED: 0,
}

UNKNOWN_ADVICE = (
    "the message may or may not have been delivered; do not resend it automatically, "
    "check with the recipient first"
)


def weakest(outcomes: list[Outcome]) -> Outcome:
    return min(outcomes, key=lambda o: o.strength) if outcomes else Outcome.REFUSED


def valid_name(name: str) -> bool:
    return NAME_RE.fullmatch(name) is not None


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


@dataclass(frozen=True, slots=True)
class Attachment:
    kind: str
    name: str
    content: str
    language: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "name": self.name, "content": self.content}
        if self.language is not None:
            d["language"] = self.language
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Attachment:
        return cls(d["kind"], d["name"], d["content"], d.get("language"))


@dataclass(frozen=True, slots=True)
class Peer:
    """Who sent a message."""

    id: str
    name: str | None
    host: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "host": self.host}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Peer:
        return cls(d["id"], d.get("name"), d["host"])


@dataclass(frozen=True, slots=True)
class Message:
    id: str
    sender: Peer
    to: str
    text: str
    attachments: tuple[Attachment, ...] = ()
    reply_to: str | None = None
    expects_reply: bool = False
    sent_at: str = field(default_factory=now_iso)
    flags: tuple[str, ...] = ()

    def canonical_payload(self) -> bytes:
        """What identity covers: a retry must repeat exactly this (DESIGN §6)."""
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
        return replace(self, flags=merged)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self.id,
            "from": self.sender.to_dict(),
            "to": self.to,
            "message": self.text,
            "attachments": [a.to_dict() for a in self.attachments],
            "reply_to": self.reply_to,
            "expects_reply": self.expects_reply,
            "sent_at": self.sent_at,
            "flags": list(self.flags),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls(
            id=d["id"],
            sender=Peer.from_dict(d["from"]),
            to=d["to"],
            text=d["message"],
            attachments=tuple(Attachment.from_dict(a) for a in d.get("attachments") or ()),
            reply_to=d.get("reply_to"),
            expects_reply=bool(d.get("expects_reply", False)),
            sent_at=d.get("sent_at") or now_iso(),
            flags=tuple(d.get("flags") or ()),
        )


@dataclass(frozen=True, slots=True)
class SessionInfo:
    id: str
    host: str
    name: str | None = None
    cwd: str | None = None
    model: str | None = None
    status: str | None = None
    purpose: str = "agent"
    groups: tuple[str, ...] = ("default",)
    durable: bool = False
    online: bool = True

    @property
    def display_name(self) -> str:
        return self.name or fallback_alias(self.id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "alias": self.display_name,
            "host": self.host,
            "cwd": self.cwd,
            "model": self.model,
            "status": self.status,
            "purpose": self.purpose,
            "groups": list(self.groups),
            "durable": self.durable,
            "online": self.online,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionInfo:
        return cls(
            id=d["id"],
            host=d["host"],
            name=d.get("name"),
            cwd=d.get("cwd"),
            model=d.get("model"),
            status=d.get("status"),
            purpose=d.get("purpose", "agent"),
            groups=tuple(d.get("groups") or ("default",)),
            durable=bool(d.get("durable", False)),
            online=bool(d.get("online", True)),
        )


@dataclass(frozen=True, slots=True)
class Receipt:
    """One recipient's outcome for a message."""

    id: str
    outcome: Outcome
    recipient: str | None = None
    code: str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "outcome": self.outcome.value}
        if self.recipient is not None:
            d["recipient"] = self.recipient
        if self.code is not None:
            d["code"] = self.code
        if self.message is not None:
            d["message"] = self.message
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Receipt:
        return cls(
            d["id"], Outcome(d["outcome"]), d.get("recipient"), d.get("code"), d.get("message")
        )


@dataclass(frozen=True, slots=True)
class SendResult:
    """What a sender is told. ``receipts`` is set for group targets."""

    id: str
    outcome: Outcome
    code: str | None = None
    message: str | None = None
    receipts: tuple[Receipt, ...] | None = None
    reply: Message | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "outcome": self.outcome.value}
        if self.code is not None:
            d["code"] = self.code
        if self.message is not None:
            d["message"] = self.message
        elif self.outcome is Outcome.UNKNOWN:
            d["message"] = UNKNOWN_ADVICE
        if self.receipts is not None:
            d["receipts"] = [r.to_dict() for r in self.receipts]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SendResult:
        receipts = d.get("receipts")
        return cls(
            id=d["id"],
            outcome=Outcome(d["outcome"]),
            code=d.get("code"),
            message=d.get("message"),
            receipts=tuple(Receipt.from_dict(r) for r in receipts)
            if receipts is not None
            else None,
        )
