"""Outcome rules: pure functions from what happened to what a sender is told.

Kept apart from the code that pushes frames so each rule reads (and is tested) on its own:
see docs/delivery.md for the contract these implement.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from crossintercom.errors import Code
from crossintercom.local_broker.authority.dedup import Decision, DecisionKind
from crossintercom.local_broker.sessions.conn import Push
from crossintercom.models import REFUSAL_ADVICE, Outcome, Receipt, SendResult, weakest


class Refusal(Exception):
    """Ends an operation with an outcome before anything was delivered (refused by default)."""

    def __init__(self, code: Code, message: str, outcome: Outcome = Outcome.REFUSED) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.outcome = outcome

    def result(self, message_id: str) -> SendResult:
        return SendResult(message_id, self.outcome, self.code, self.message)


def storage_failed(message_id: str, recipient: str | None, exc: BaseException) -> Receipt:
    """This host could not write its own files, so nothing was stored: safe to try again."""
    return Receipt(
        message_id,
        Outcome.NOT_SENT,
        recipient,
        Code.LOCAL_STORAGE,
        f"this host could not write its files ({exc}); nothing was stored",
    )


def local_receipt(message_id: str, recipient: str, push: Push | str, *, durable: bool) -> Receipt:
    """A local recipient's outcome: ``queued`` means the caller must queue it durably.

    Delivered on the ack; a refusal in the ack is final; a durable recipient that was not
    reached is queued; otherwise a write that may have landed is ``unknown`` and one that
    found nobody is ``not_sent`` (nothing was stored).
    """
    if push is Push.ACKED:
        return Receipt(message_id, Outcome.DELIVERED, recipient)
    # The client could not save it (full or read-only inbox): as if never pushed.
    if isinstance(push, str) and push != Code.SAVE_FAILED:
        return Receipt(message_id, Outcome.REFUSED, recipient, push, "the recipient refused it")
    if durable:
        return Receipt(message_id, Outcome.QUEUED, recipient)
    if push == Code.SAVE_FAILED:
        return Receipt(
            message_id,
            Outcome.NOT_SENT,
            recipient,
            Code.LOCAL_STORAGE,
            "the recipient could not save it (its inbox cannot be written); nothing was stored",
        )
    if push is Push.TIMEOUT:
        return Receipt(
            message_id,
            Outcome.UNKNOWN,
            recipient,
            Code.NO_ACK,
            "the recipient did not confirm in time; do not resend automatically",
        )
    return Receipt(
        message_id, Outcome.NOT_SENT, recipient, Code.RECIPIENT_GONE, "the recipient left"
    )


def reply_receipt(reply_id: str, asker: str, *, pushed: bool, durable: bool) -> Receipt:
    """A reply on the asker's host: to a live connection, else its queue, else refused."""
    if pushed:
        return Receipt(reply_id, Outcome.DELIVERED, asker)
    if durable:
        return Receipt(reply_id, Outcome.QUEUED, asker)
    return Receipt(
        reply_id,
        Outcome.REFUSED,
        asker,
        Code.ASKER_GONE,
        REFUSAL_ADVICE[Code.ASKER_GONE],
    )


def combine(message_id: str, receipts: list[Receipt], *, group: bool) -> SendResult:
    """One result for all recipients: a group's is its weakest receipt, with every receipt."""
    outcome = weakest([r.outcome for r in receipts])
    if group:
        return SendResult(message_id, outcome, receipts=tuple(receipts))
    return SendResult(message_id, outcome, receipts[0].code, receipts[0].message)


def lodged(decision: Decision, message_id: str) -> SendResult | None:
    """What the dedup authority's answer means: ``None`` to go ahead, else the answer."""
    if decision.kind in (DecisionKind.NEW, DecisionKind.FORWARD_AGAIN):
        return None
    if decision.kind is DecisionKind.RETAINED:
        return retained(decision.outcome, message_id)
    if decision.kind is DecisionKind.CONFLICT:
        return SendResult.refused(
            message_id,
            Code.PAYLOAD_CONFLICT,
            f"message id {message_id} was already used for another payload",
        )
    if decision.kind is DecisionKind.OVER_CAPACITY:
        return SendResult.refused(
            message_id,
            Code.OVER_CAPACITY,
            "too many operations awaiting confirmation on this host; try again shortly",
        )
    return SendResult(
        message_id,
        Outcome.UNKNOWN,
        Code.UNCERTAIN,
        "an earlier attempt with this id was interrupted; it may have been "
        "delivered. Do not resend automatically; check with the recipient",
    )


def retained(outcome: dict[str, Any] | None, message_id: str) -> SendResult:
    if outcome is None:
        return SendResult(message_id, Outcome.UNKNOWN)
    return msgspec.convert(outcome, SendResult)


def to_retain(result: SendResult) -> dict[str, Any]:
    """The form the dedup authority keeps (no message text: see docs/delivery.md)."""
    out: dict[str, Any] = msgspec.to_builtins(result)
    return out


Settle = Literal["abandon", "keep_lodged", "accept"]


def settle(outcome: Outcome, *, remote: bool) -> Settle:
    """What the dedup record becomes once the outcome is known."""
    if outcome is Outcome.NOT_SENT:
        return "abandon"  # nothing went out: a retry may go through
    if outcome is Outcome.UNKNOWN and remote:
        return "keep_lodged"  # a retry is forwarded and the store answers by id
    return "accept"


def reply_refused(reply_id: str, status: str, reply_to: str | None) -> SendResult:
    """A reply that found no pending ask to consume (``status`` from ``consume_pending``)."""
    if status == "already":
        return SendResult.refused(
            reply_id, Code.ALREADY_REPLIED, f"ask {reply_to} was already answered"
        )
    if reply_to:
        return SendResult.refused(
            reply_id, Code.REPLY_NOT_AUTHORISED, f"no ask {reply_to} was delivered to you"
        )
    return SendResult.refused(
        reply_id, Code.REPLY_NOT_AUTHORISED, "no ask is waiting for your reply"
    )


def reopens_ask(outcome: Outcome) -> bool:
    """A reply's pending entry is given back only when the reply surely went nowhere: after
    ``unknown`` the first reply may have arrived, and a second one would contradict it."""
    return outcome is Outcome.NOT_SENT
