"""Parts of the page that need no browser: an ask's overdue mark (pushed again when it flips,
since the page is sent the attention view only when more than ages changed) and which
messages' receipts are re-read from the archive."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from crossintercom.web import attention, sources

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ask(mid: str, age_s: float, *outcomes: str) -> dict[str, Any]:
    sent = (NOW - timedelta(seconds=age_s)).isoformat().replace("+00:00", "Z")
    return {
        "id": mid,
        "from": {"id": "s1", "name": "dan", "host": "D"},
        "to": "eve@E",
        "sent_at": sent,
        "expects_reply": True,
        "recipients": [{"session_id": f"r{i}", "outcome": o} for i, o in enumerate(outcomes)],
    }


def test_an_ask_is_overdue_once_its_wait_passed_and_only_with_a_wait() -> None:
    items = [ask("early", 30, "delivered"), ask("late", 90, "shown"), ask("none", 900, "queued")]
    found = attention.attention(items, {}, "me", {"early": 60.0, "late": 60.0}, now=NOW.timestamp())
    by_id = {e["id"]: e for e in found if e["kind"] == "ask"}
    assert {k: (e["timeout_s"], e["overdue"]) for k, e in by_id.items()} == {
        "early": (60.0, False),
        "late": (60.0, True),
        "none": (None, False),
    }
    # The flip is not just an age: it changes what the page is pushed.
    later = attention.attention(
        items, {}, "me", {"early": 60.0, "late": 60.0}, now=NOW.timestamp() + 60
    )
    assert [e["overdue"] for e in later if e["id"] == "early"] == [True]


def test_only_messages_whose_receipts_may_move_are_rechecked() -> None:
    items = [
        ask("moving", 1, "delivered", "refused"),
        ask("shown", 1, "shown"),
        ask("done", 1, "acknowledged", "expired"),
        ask("empty", 1),
    ]
    assert sources.unsettled(items) == ["moving", "shown"]
