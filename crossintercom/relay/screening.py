"""What a receiving relay checks before it hands a store row to its broker.

Anyone who can write the store (a buggy or compromised host, a stray writer of a SQLite file)
can put anything in a row. A row is handed over only when its payload is a message of the
right shape, its id is the row's, it matches the digest its sender stored (a row rewritten
since, by a writer or its trigger, does not), it fits the size limits, and its sender is one
the writing host may use: its own host id, and a session id no other host claims. Flags a
sender stored are dropped (the receiving side sets its own). Anything
else is refused once, with a code and a logged reason, and the rows behind it go on
(docs/operations.md).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from crossintercom.errors import Code
from crossintercom.models import Attachment, Message, Peer, SessionInfo
from crossintercom.storage import InboundRow

# Room for the frame around a message (type, request id, recipient).
FRAME_OVERHEAD: Final = 4096


# The bounded check. A stored text is passed on as it is only when it decodes into these: a
# message with no field it does not know, nested three deep at most. Anything else (a field of
# a newer version, or a writer's) is decoded leniently and the message encoded afresh, as
# before: unknown fields could nest deep enough to decode here and fail in the broker, whose
# stack is deeper (msgspec's depth limit is the interpreter's recursion limit), and one frame
# that fails there holds back every row behind it.
class _KnownPeer(Peer, frozen=True, forbid_unknown_fields=True):
    pass


class _KnownAttachment(Attachment, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    pass


class _KnownMessage(Message, frozen=True, tag="message", forbid_unknown_fields=True):
    sender: _KnownPeer = msgspec.field(name="from")
    attachments: tuple[_KnownAttachment, ...] = ()


_known = msgspec.json.Decoder(_KnownMessage)
_lenient = msgspec.json.Decoder(Message)


@dataclass(frozen=True, slots=True)
class Refusal:
    code: Code
    reason: str


@dataclass(frozen=True, slots=True)
class Cleared:
    """A row that may be handed over: its message, and the JSON the frame carries for it (the
    stored text itself, decoded into ``message`` just now, so the broker decodes the same
    bytes into the same message; docs/perf-log/2026-12.md, "Catch-up: the read ahead and the
    stored text passed through")."""

    message: Message
    wire: msgspec.Raw


def claims(
    local_host: str, local: Iterable[SessionInfo], remote: Iterable[SessionInfo]
) -> dict[str, set[str]]:
    """Which hosts claim each session id: this host for its own sessions, the roster for the
    rest. A sender id claimed by a host other than the row's writer is not its to use."""
    out: dict[str, set[str]] = {}
    for s in local:
        out.setdefault(s.id, set()).add(local_host)
    for s in remote:
        out.setdefault(s.id, set()).add(s.host)
    return out


def screen(
    row: InboundRow,
    *,
    host: str,
    max_message_bytes: int,
    max_frame_bytes: int,
    claimed: Mapping[str, set[str]],
) -> Cleared | Refusal:
    """The row's message and the JSON to hand over if it may be, else why not. The stored
    text is decoded once, straight into a message, and handed over as it is when it passed
    the bounded check (known fields only, its exact length within the frame's budget); else
    the message is encoded afresh, as before."""
    if row.payload_problem is not None or row.text is None:
        problem = row.payload_problem or "payload is missing"
        code = Code.TOO_LARGE if "over the" in problem else Code.BAD_MESSAGE
        return Refusal(code, problem)
    text = row.text.encode()
    try:
        msg: Message = _known.decode(text)
    except (msgspec.DecodeError, RecursionError):
        lenient = _decode_lenient(text)
        if isinstance(lenient, Refusal):
            return lenient
        msg, text = lenient, msgspec.json.encode(lenient)
    if msg.flags:
        # Flags are the receiving side's words (docs/protocol.md): its broker and client set
        # them. A sender's (`possible_repeat`, `late`, ...) are dropped; they are not signed.
        msg = msgspec.structs.replace(msg, flags=())
        text = msgspec.json.encode(msg)
    if msg.id != row.message_id:
        return Refusal(Code.BAD_MESSAGE, f"payload id {msg.id!r} is not the row's id")
    if row.digest is not None and not hmac.compare_digest(msg.digest(), row.digest):
        # The sender stored the digest with the text; a row changed since (a writer of the
        # store rewriting other hosts' mail, a trigger) no longer matches it.
        return Refusal(
            Code.BAD_MESSAGE, "payload does not match the digest its sender stored (rewritten?)"
        )
    size = msg.size()
    if size > max_message_bytes:
        return Refusal(
            Code.TOO_LARGE, f"message of {size} bytes is over the {max_message_bytes} limit"
        )
    budget = max_frame_bytes - FRAME_OVERHEAD
    if len(text) > budget:
        # Stored with room to spare (padding, escapes): the message encoded afresh, as
        # before, when that fits.
        text = msgspec.json.encode(msg)
        if len(text) > budget:
            return Refusal(Code.TOO_LARGE, f"message does not fit a {max_frame_bytes}-byte frame")
    forged = _forged_sender(row, msg, host, claimed)
    if forged is not None:
        return Refusal(Code.FORGED_SENDER, forged)
    return Cleared(msg, msgspec.Raw(text))


def _decode_lenient(text: bytes) -> Message | Refusal:
    """A payload that is not a message of known fields only: decoded as any message, or why
    it is not one."""
    try:
        return _lenient.decode(text)
    except msgspec.ValidationError as exc:
        return Refusal(Code.BAD_MESSAGE, f"payload is not a valid message: {exc}")
    except msgspec.DecodeError as exc:
        return Refusal(Code.BAD_MESSAGE, f"payload is not JSON: {exc}")
    except RecursionError:
        return Refusal(Code.BAD_MESSAGE, "payload is nested too deeply to be a message")


def _forged_sender(
    row: InboundRow, msg: Message, host: str, claimed: Mapping[str, set[str]]
) -> str | None:
    if row.sender_host == host:
        # This host's own mail never goes through the store: only a forger writes such a row.
        return f"row claims to come from this host ({host})"
    if msg.sender.host != row.sender_host:
        return (
            f"sender {msg.sender.host!r} in the payload is not the writing host {row.sender_host!r}"
        )
    others = claimed.get(msg.sender.id, set()) - {row.sender_host}
    if others:
        return (
            f"sender session {msg.sender.id} belongs to {', '.join(sorted(others))}, "
            f"not to {row.sender_host}"
        )
    return None
