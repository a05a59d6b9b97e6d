"""Parts of the page that need no browser: an ask's overdue mark (pushed again when it flips,
since the page is sent the attention view only when more than ages changed), which messages'
receipts are re-read from the archive, and a host's lease dated by the store's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from crossintercom.storage import HostRow
from crossintercom.web import attention, sources
from crossintercom.web.hosts import HostLeases

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


def test_a_fresh_page_dates_a_dead_host_by_the_stores_clock() -> None:
    now = NOW.timestamp()
    leases = HostLeases(lease_s=10.0, heartbeat_s=1.0, drop_after=86_400.0)
    rows = [HostRow("alive", 1, 5, 0, 0.5), HostRow("dead", 1, 9, 0, 7200.0)]
    listed, dropped = leases.view(rows, now)
    by_host = {h["host"]: h for h in listed}
    assert dropped == set()
    assert by_host["alive"]["lease"] == "held"
    # Dead for two hours before this page started: lapsed at once, dated two hours back.
    assert by_host["dead"]["lease"] == "lapsed"
    assert by_host["dead"]["beat_at"] == "2026-12-01T10:00:00Z"
    # Past --drop-hosts-after (counted from its lease's end): left out at once too.
    short = HostLeases(lease_s=10.0, heartbeat_s=1.0, drop_after=3600.0)
    assert short.view(rows, now)[1] == {"dead"}
    # A store without the stamp: judged on this page's sight of the counter (a full lease).
    old_store = HostLeases(lease_s=10.0, heartbeat_s=1.0, drop_after=3600.0)
    [row] = old_store.view([HostRow("dead", 1, 9, 0)], now)[0]
    assert (row["lease"], row["beat_at"]) == ("held", "2026-12-01T12:00:00Z")
