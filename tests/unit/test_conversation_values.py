"""Pure pieces of threads, search and the overseer page's guard (no process, no socket)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crossintercom.models import Message, Peer
from crossintercom.search_model import search_terms
from crossintercom.timeparse import parse_age, parse_since
from crossintercom.web.auth import Guard, allowed_hosts


def test_every_message_has_a_thread_and_a_subject_changes_the_digest_only_when_set() -> None:
    plain = Message("m1", Peer("s", "a", "h"), "b", "hi")
    assert (plain.thread_id, plain.subject) == ("m1", None)
    old_payload = plain.canonical_payload()
    assert b"subject" not in old_payload and b"thread" not in old_payload
    # A message saved before threads existed reads as its own thread.
    assert (
        Message.from_dict({k: v for k, v in plain.to_dict().items() if k != "thread_id"}).thread_id
        == "m1"
    )
    with_subject = Message("m1", Peer("s", "a", "h"), "b", "hi", subject="plan")
    assert with_subject.digest() != plain.digest()
    moved = Message("m1", Peer("s", "a", "h"), "b", "hi", thread_id="root")
    assert moved.digest() == plain.digest()  # the thread is derived, not identity


def test_since_and_ages() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert parse_since("90m", now) == now - timedelta(minutes=90)
    assert parse_since("2w", now) == now - timedelta(days=14)
    assert parse_since("2026-11-30", now) == datetime(2026, 11, 30, tzinfo=UTC)
    assert parse_since("2026-11-30T10:00:00+02:00", now).utcoffset() == timedelta(hours=2)
    assert parse_age("30d") == 30 * 86400
    for bad in ("yesterday", "5 years", "-3d", ""):
        with pytest.raises(ValueError):
            parse_since(bad, now)


def test_search_terms_drop_every_kind_of_query_syntax() -> None:
    assert search_terms('"deploy" NEAR(a b) * : -x OR 50% _y; DROP--') == [
        "deploy", "near", "a", "b", "x", "or", "50", "_y", "drop",
    ]  # fmt: skip
    assert search_terms("'\"*()-:") == []


def test_guard_checks_token_csrf_host_and_origin() -> None:
    guard = Guard(hosts=allowed_hosts("127.0.0.1", 8765))
    assert guard.token_ok(guard.token) and not guard.token_ok("x") and not guard.token_ok(None)
    assert guard.csrf_ok(guard.csrf) and not guard.csrf_ok(guard.token)
    assert guard.host_ok("127.0.0.1:8765") and guard.host_ok("localhost:8765")
    assert not guard.host_ok("evil.example:8765") and not guard.host_ok("127.0.0.1:1")
    assert guard.origin_ok(None) and guard.origin_ok("http://localhost:8765")
    assert not guard.origin_ok("http://evil.example") and not guard.origin_ok("null")
    assert Guard().token != Guard().token
