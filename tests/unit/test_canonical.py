"""The canonical payload keeps its bytes: digests in the store and dedup records depend on them.

The encoder changed from the stdlib ``json`` module to msgspec for speed; these tests hold the
bytes equal to the stdlib spelling the project started with, for any text and attachments.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossintercom.models import Attachment, Message, Peer


def stdlib_canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# Everything but lone surrogates, which neither spelling can encode as UTF-8.
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_ATTACHMENT = st.builds(
    Attachment,
    kind=st.sampled_from(["file", "snippet", "context"]),
    name=_TEXT,
    content=_TEXT,
    language=st.none() | _TEXT,
)


@settings(max_examples=300, deadline=None)
@given(
    text=_TEXT,
    to=_TEXT,
    attachments=st.lists(_ATTACHMENT, max_size=3),
    reply_to=st.none() | _TEXT,
    expects_reply=st.booleans(),
)
def test_canonical_payload_bytes_unchanged(
    text: str, to: str, attachments: list[Attachment], reply_to: str | None, expects_reply: bool
) -> None:
    msg = Message(
        id="m",
        sender=Peer("sender-id", "alice", "host-a"),
        to=to,
        text=text,
        attachments=tuple(attachments),
        reply_to=reply_to,
        expects_reply=expects_reply,
    )
    expected = stdlib_canonical(
        {
            "from": "sender-id",
            "to": to,
            "message": text,
            "attachments": [a.to_dict() for a in attachments],
            "reply_to": reply_to,
            "expects_reply": expects_reply,
        }
    )
    assert msg.canonical_payload() == expected


@pytest.mark.parametrize("text", ["\x00\x1f\x7f", '"\\/', "\u2028\u2029\ufeff", "é😀"])
def test_escapes_match_stdlib(text: str) -> None:
    msg = Message(id="m", sender=Peer("s", None, "h"), to="t", text=text)
    assert b'"message":' in msg.canonical_payload()
    assert msg.canonical_payload() == stdlib_canonical(
        {
            "from": "s",
            "to": "t",
            "message": text,
            "attachments": [],
            "reply_to": None,
            "expects_reply": False,
        }
    )
