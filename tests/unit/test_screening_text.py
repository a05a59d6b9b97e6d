"""The receiving relay's bounded check of a stored payload before its text is handed over as it
is (``relay.screening``; docs/perf-log/2026-12.md, "Catch-up: the read ahead and the stored text
passed through"): an honest row's text goes to the broker byte for byte; anything else is
either encoded afresh from the message it decodes to, as before, or refused with a clear
reason, and never reaches the broker as something it could fail to decode."""

from __future__ import annotations

import uuid

import msgspec
import pytest

from crossintercom import protocol as p
from crossintercom.errors import Code
from crossintercom.models import Attachment, Message, Peer
from crossintercom.relay import screening
from crossintercom.storage import InboundRow

HOST, SENDER_HOST = "recv", "send"
FRAME = 64 * 1024


def _message(text: str = "hello") -> Message:
    return Message(
        str(uuid.uuid4()),
        Peer("s-1", "planner", SENDER_HOST),
        to=f"sink@{HOST}",
        text=text,
        attachments=(Attachment("file", "a.txt", "content"),),
    )


def _row(msg: Message, text: str | bytes) -> InboundRow:
    stored = text.decode() if isinstance(text, bytes) else text
    return InboundRow(1, msg.id, f"{HOST}:sink", stored, SENDER_HOST, None, msg.digest())


def _screen(row: InboundRow) -> screening.Cleared | screening.Refusal:
    return screening.screen(
        row, host=HOST, max_message_bytes=FRAME, max_frame_bytes=FRAME, claimed={}
    )


def _broker_reads(cleared: screening.Cleared) -> Message:
    """What the broker decodes from the frame the relay writes."""
    frame = p.InboundBatchText(7, f"{HOST}:sink", [cleared.wire])
    decoded = p.decode_client_frame(p.encode(frame)[p.HEADER.size :])
    assert isinstance(decoded, p.InboundBatch)
    [msg] = decoded.messages
    return msg


def test_an_honest_row_is_handed_over_as_stored() -> None:
    msg = _message()
    stored = msgspec.json.encode(msg.to_dict())
    cleared = _screen(_row(msg, stored))
    assert isinstance(cleared, screening.Cleared)
    assert bytes(cleared.wire) == stored
    assert _broker_reads(cleared) == msg


@pytest.mark.parametrize("depth", [3, 500, 100_000])
def test_unknown_fields_are_dropped_or_refused_never_passed_through(depth: int) -> None:
    """A field no message has, nested at any depth, never reaches the broker: decoded with
    the message's fields only and encoded afresh, or refused when it cannot be decoded at all
    (deeper than the interpreter's recursion limit)."""
    msg = _message()
    data = msg.to_dict()
    data["from"] = {**data["from"], "extra": 1}
    stored = msgspec.json.encode(data)[:-1] + b',"zz":' + b"[" * depth + b"]" * depth + b"}"
    checked = _screen(_row(msg, stored))
    if depth < 1000:
        assert isinstance(checked, screening.Cleared)
        assert b"zz" not in bytes(checked.wire) and b"extra" not in bytes(checked.wire)
        assert _broker_reads(checked) == msg
    else:
        assert checked == screening.Refusal(
            Code.BAD_MESSAGE, "payload is nested too deeply to be a message"
        )


def test_a_stored_text_over_the_frame_is_refused_or_encoded_afresh() -> None:
    # Padded past the frame's budget, the message small: encoded afresh, it fits.
    msg = _message()
    padded = msgspec.json.encode(msg.to_dict())[:-1] + b" " * FRAME + b"}"
    checked = _screen(_row(msg, padded))
    assert isinstance(checked, screening.Cleared)
    assert len(checked.wire) < 1024 and _broker_reads(checked) == msg
    # A message whose own text does not fit a frame (written by a host with a larger limit).
    big = _message("x" * (FRAME - 100))
    checked = screening.screen(
        _row(big, msgspec.json.encode(big.to_dict())),
        host=HOST,
        max_message_bytes=10 * FRAME,
        max_frame_bytes=FRAME,
        claimed={},
    )
    assert checked == screening.Refusal(
        Code.TOO_LARGE, f"message does not fit a {FRAME}-byte frame"
    )


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        ('{"id": "x"', "payload is not JSON: "),
        ("[1, 2]", "payload is not a valid message: Expected `object`, got `array`"),
        ("null", "payload is not a valid message: Expected `object`, got `null`"),
        (
            '{"id": "x", "from": {"id": "a", "name": null, "host": "send"}} and more',
            "payload is not JSON: ",
        ),
    ],
)
def test_what_is_not_a_message_is_refused_with_its_reason(stored: str, reason: str) -> None:
    checked = _screen(_row(_message(), stored))
    assert isinstance(checked, screening.Refusal)
    assert checked.code == Code.BAD_MESSAGE and checked.reason.startswith(reason)


def test_a_payload_the_store_did_not_read_is_refused_as_too_large() -> None:
    msg = _message()
    row = InboundRow(
        1, msg.id, f"{HOST}:sink", None, SENDER_HOST, "payload of 9 characters is over the 8"
    )
    checked = _screen(row)
    assert checked == screening.Refusal(Code.TOO_LARGE, "payload of 9 characters is over the 8")
