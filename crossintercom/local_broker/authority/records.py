"""The dedup authority's records in memory: decisions, entries, sizes and the retained outcome's
text (docs/delivery.md). Pure values and checks; ``dedup`` keeps the records and decides."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from crossintercom.local_broker.authority.schema import HMAC_HEX_LEN, MAX_OP_ID_LEN

# Fixed per-record cost added to id + hmac + outcome, standing in for index and row overhead.
RECORD_OVERHEAD = 64


class DecisionKind(Enum):
    """What ``lodge`` found; ``outcomes.lodged`` turns it into a result and its code (these
    are not codes: nothing here is sent or stored)."""

    NEW = auto()
    RETAINED = auto()
    CONFLICT = auto()
    UNCERTAIN = auto()
    FORWARD_AGAIN = auto()
    OVER_CAPACITY = auto()


@dataclass(frozen=True)
class Decision:
    """What ``lodge`` found. ``outcome`` is set only for ``retained`` (a fresh copy each time)."""

    kind: DecisionKind
    outcome: dict[str, Any] | None = None


NEW = Decision(DecisionKind.NEW)
CONFLICT = Decision(DecisionKind.CONFLICT)
UNCERTAIN = Decision(DecisionKind.UNCERTAIN)
FORWARD_AGAIN = Decision(DecisionKind.FORWARD_AGAIN)
OVER_CAPACITY = Decision(DecisionKind.OVER_CAPACITY)


class Entry:
    """In-memory mirror of one row, so ``lodge`` needs no read round trip."""

    __slots__ = ("accepted", "deadline", "digest", "size")

    def __init__(self, deadline: float, digest: str, accepted: bool, size: int) -> None:
        self.deadline = deadline
        self.digest = digest
        self.accepted = accepted
        self.size = size


def record_size(op_id: str, outcome_json: str | None) -> int:
    size = len(op_id.encode()) + HMAC_HEX_LEN + RECORD_OVERHEAD
    if outcome_json is not None:
        size += len(outcome_json.encode())
    return size


def check_op_id(op_id: str) -> None:
    if not isinstance(op_id, str) or not op_id or len(op_id) > MAX_OP_ID_LEN:
        raise ValueError(f"operation id must be a non-empty string of at most {MAX_OP_ID_LEN}")


def _carries_text(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k == "text" or _carries_text(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_carries_text(v) for v in value)
    return False


def encode_outcome(outcome: dict[str, Any]) -> str:
    if not isinstance(outcome, dict):
        raise ValueError("outcome must be a JSON object")
    # The file promises to hold no message text; a "text" key means the caller passed a message.
    if _carries_text(outcome):
        raise ValueError("outcome must not carry message text")
    try:
        return json.dumps(outcome, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"outcome is not JSON-serialisable: {e}") from None
