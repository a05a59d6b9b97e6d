"""What a receiving relay checks before it hands a store row to its broker.

Anyone who can write the store (a buggy or compromised host, a stray writer of a SQLite file)
can put anything in a row. A row is handed over only when its payload is a message of the
right shape, its id is the row's, it matches the digest its sender stored (a row rewritten
since, by a writer or its trigger, does not), it fits the size limits, and its sender is one
the writing host may use: its own host id, and a session id no other host claims. Anything
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
from crossintercom.models import Message, SessionInfo
from crossintercom.storage import InboundRow

# Room for the frame around a message (type, request id, recipient).
FRAME_OVERHEAD: Final = 4096
# A JSON string may take up to 6 bytes per byte of text (\u escapes): below that bound, the
# exact encoding need not be measured.
WORST_JSON_GROWTH: Final = 6


@dataclass(frozen=True, slots=True)
class Refusal:
    code: Code
    reason: str


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
) -> Message | Refusal:
    """The row's message if it may be handed over, else why not."""
    if row.payload_problem is not None:
        code = Code.TOO_LARGE if "over the" in row.payload_problem else Code.BAD_MESSAGE
        return Refusal(code, row.payload_problem)
    if not isinstance(row.payload, dict):
        kind = "null" if row.payload is None else type(row.payload).__name__
        return Refusal(Code.BAD_MESSAGE, f"payload is {kind}, not a message object")
    try:
        msg = Message.from_dict(row.payload)
    except ValueError as exc:
        return Refusal(Code.BAD_MESSAGE, f"payload is not a valid message: {exc}")
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
    if size * WORST_JSON_GROWTH > budget and len(msgspec.json.encode(msg)) > budget:
        return Refusal(Code.TOO_LARGE, f"message does not fit a {max_frame_bytes}-byte frame")
    forged = _forged_sender(row, msg, host, claimed)
    if forged is not None:
        return Refusal(Code.FORGED_SENDER, forged)
    return msg


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
