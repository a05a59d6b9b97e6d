"""Outcome rules, in process (docs/delivery.md): what each push, reply and dedup answer means."""

from __future__ import annotations

import msgspec
import pytest

from crossintercom.errors import Code
from crossintercom.local_broker.authority.dedup import Decision, DecisionKind
from crossintercom.local_broker.delivery import outcomes
from crossintercom.local_broker.sessions.conn import Push
from crossintercom.models import Outcome, Receipt, SendResult, outcome_for_state, weakest


@pytest.mark.parametrize(
    ("push", "durable", "outcome", "code"),
    [
        (Push.ACKED, False, Outcome.DELIVERED, None),
        (Push.ACKED, True, Outcome.DELIVERED, None),
        ("id_conflict", True, Outcome.REFUSED, "id_conflict"),
        (Code.SAVE_FAILED, True, Outcome.QUEUED, None),
        (Code.SAVE_FAILED, False, Outcome.NOT_SENT, "local_storage"),
        (Push.OFFLINE, True, Outcome.QUEUED, None),
        (Push.CONNECTION_LOST, True, Outcome.QUEUED, None),
        (Push.TIMEOUT, True, Outcome.QUEUED, None),
        (Push.TIMEOUT, False, Outcome.UNKNOWN, "no_ack"),
        (Push.CONNECTION_LOST, False, Outcome.NOT_SENT, "recipient_gone"),
        (Push.OFFLINE, False, Outcome.NOT_SENT, "recipient_gone"),
    ],
)
def test_local_receipt(push: Push | str, durable: bool, outcome: Outcome, code: str | None) -> None:
    r = outcomes.local_receipt("m", "rcpt", push, durable=durable)
    assert (r.id, r.recipient, r.outcome, r.code) == ("m", "rcpt", outcome, code)


def test_reply_receipt() -> None:
    assert outcomes.reply_receipt("r", "a", pushed=True, durable=False).outcome is Outcome.DELIVERED
    assert outcomes.reply_receipt("r", "a", pushed=False, durable=True).outcome is Outcome.QUEUED
    gone = outcomes.reply_receipt("r", "a", pushed=False, durable=False)
    assert (gone.outcome, gone.code) == (Outcome.REFUSED, "asker_gone")


def test_a_group_result_is_its_weakest_receipt_and_lists_them_all() -> None:
    receipts = [
        Receipt("m", Outcome.DELIVERED, "a"),
        Receipt("m", Outcome.QUEUED, "b"),
        Receipt("m", Outcome.UNKNOWN, "c", "relay_lost"),
    ]
    result = outcomes.combine("m", receipts, group=True)
    assert result.outcome is Outcome.UNKNOWN
    assert result.receipts == tuple(receipts)
    assert result.code is None


def test_a_single_result_carries_its_receipts_code() -> None:
    r = outcomes.combine("m", [Receipt("m", Outcome.NOT_SENT, "a", "no_relay", "why")], group=False)
    assert (r.outcome, r.code, r.message, r.receipts) == (Outcome.NOT_SENT, "no_relay", "why", None)


def test_weakest_order() -> None:
    order = [
        Outcome.DELIVERED,
        Outcome.QUEUED,
        Outcome.UNKNOWN,
        Outcome.NOT_SENT,
        Outcome.EXPIRED,
        Outcome.REFUSED,
    ]
    for i, strong in enumerate(order):
        for weak in order[i:]:
            assert weakest([strong, weak]) is weak
    assert weakest([]) is Outcome.REFUSED


@pytest.mark.parametrize(
    ("kind", "outcome", "code"),
    [
        (DecisionKind.CONFLICT, Outcome.REFUSED, "payload_conflict"),
        (DecisionKind.OVER_CAPACITY, Outcome.REFUSED, "over_capacity"),
        (DecisionKind.UNCERTAIN, Outcome.UNKNOWN, "uncertain"),
    ],
)
def test_lodged_answers(kind: DecisionKind, outcome: Outcome, code: str) -> None:
    got = outcomes.lodged(Decision(kind), "m")
    assert got is not None
    assert (got.id, got.outcome, got.code) == ("m", outcome, code)


def test_lodged_goes_ahead_for_new_and_forward_again() -> None:
    assert outcomes.lodged(Decision(DecisionKind.NEW), "m") is None
    assert outcomes.lodged(Decision(DecisionKind.FORWARD_AGAIN), "m") is None


def test_retained_outcome_round_trips_through_the_authority_form() -> None:
    result = SendResult(
        "m", Outcome.QUEUED, receipts=(Receipt("m", Outcome.QUEUED, "a", "queued_at_host"),)
    )
    kept = outcomes.to_retain(result)
    assert "message" not in kept and "text" not in kept
    assert outcomes.lodged(Decision(DecisionKind.RETAINED, kept), "m") == result
    assert outcomes.retained(None, "m").outcome is Outcome.UNKNOWN


def test_settle() -> None:
    assert outcomes.settle(Outcome.NOT_SENT, remote=False) == "abandon"
    assert outcomes.settle(Outcome.NOT_SENT, remote=True) == "abandon"
    assert outcomes.settle(Outcome.UNKNOWN, remote=True) == "keep_lodged"
    assert outcomes.settle(Outcome.UNKNOWN, remote=False) == "accept"
    assert outcomes.settle(Outcome.DELIVERED, remote=True) == "accept"


def test_reply_refusals() -> None:
    assert outcomes.reply_refused("r", "already", "a1").code == "already_replied"
    assert outcomes.reply_refused("r", "none", "a1").code == "reply_not_authorised"
    assert "a1" in outcomes.reply_refused("r", "none", "a1").message  # type: ignore[operator]
    assert outcomes.reply_refused("r", "none", None).code == "reply_not_authorised"


@pytest.mark.parametrize(
    ("state", "code", "expected"),
    [
        ("delivered", None, (Outcome.DELIVERED, None)),
        ("delivered", "queued", (Outcome.QUEUED, "queued_at_host")),
        ("queued", None, (Outcome.QUEUED, None)),
        ("expired", None, (Outcome.EXPIRED, "expired")),
        ("refused", "too_large", (Outcome.REFUSED, "too_large")),
        ("refused", None, (Outcome.REFUSED, "refused")),
    ],
)
def test_one_mapping_from_store_state_to_outcome(
    state: str, code: str | None, expected: tuple[Outcome, str | None]
) -> None:
    outcome, got_code, _ = outcome_for_state(state, code)
    assert (outcome, got_code) == expected


def test_expired_is_an_outcome_a_receipt_can_carry() -> None:
    wire = {"id": "m", "outcome": "expired", "recipient": "a", "code": "expired"}
    r = Receipt.from_dict(wire)
    assert r.outcome is Outcome.EXPIRED
    assert msgspec.json.decode(msgspec.json.encode(r)) == wire


@pytest.mark.parametrize(
    ("code", "words"),
    [
        ("sender_refused", "the recipient does not take mail from this sender"),
        ("not_found", "no such session on the recipient's host"),
        (None, "the recipient's host refused it"),
        ("a_code_from_a_newer_host", "the recipient's host refused it"),
    ],
)
def test_a_refusal_from_a_store_row_is_worded_by_its_code(code: str | None, words: str) -> None:
    """The row carries a code and no text: every refusal still reads as a sentence."""
    assert outcome_for_state("refused", code)[2] == words
