"""Batched enqueue and ack keep the one-by-one semantics, on every backend."""

from __future__ import annotations

import pytest

from crossintercom.storage import Ack, MailboxStore, OutboundItem, open_store, sqlstore
from crossintercom.storage.blocking import run

SENDER, RECIPIENT = "alice@a", "bob@b"


def item(
    mid: str, session: str = "s1", *, digest: str = "d" * 64, host: str = RECIPIENT, size: int = 10
) -> OutboundItem:
    return OutboundItem(mid, SENDER, host, session, digest, {"id": mid}, size)


def outcome(results: list) -> list[tuple[str, str, str, bool, str | None]]:  # type: ignore[type-arg]
    return [(r.message_id, r.recipient_session, r.state, r.inserted, r.code) for r in results]


def test_batch_with_conflicts_in_the_middle_answers_item_by_item(store: MailboxStore) -> None:
    gen = run(store.claim_host(RECIPIENT))
    run(store.enqueue([item("old"), item("done")]))
    assert run(store.ack(RECIPIENT, gen, [Ack("done", "s1", "delivered")])) == 1
    batch = [
        item("a"),
        item("old", digest="e" * 64),  # existing row, other payload
        item("done"),  # existing, finished
        item("b", size=10**9),  # too large: nothing written
        item("a", "s2"),  # same message, second recipient
        item("a", digest="f" * 64),  # same id as an earlier item in this batch, other payload
        item("a"),  # repeat of the first pair in the batch
        item("old", "s2"),  # existing message, new recipient
        item("c"),
    ]
    assert outcome(run(store.enqueue(batch))) == [
        ("a", "s1", "queued", True, None),
        ("old", "s1", "refused", False, "payload_conflict"),
        ("done", "s1", "delivered", False, None),
        ("b", "s1", "refused", False, "too_large"),
        ("a", "s2", "queued", True, None),
        ("a", "s1", "refused", False, "payload_conflict"),
        ("a", "s1", "queued", False, None),
        ("old", "s2", "queued", True, None),
        ("c", "s1", "queued", True, None),
    ]
    assert run(store.get_message("b")) is None
    assert run(store.get_message("a")).digest == "d" * 64  # type: ignore[union-attr]
    # seq order is item order within the batch.
    rows = run(store.fetch_inbound(RECIPIENT, gen))
    assert [(r.message_id, r.recipient_session) for r in rows] == [
        ("old", "s1"),
        ("a", "s1"),
        ("a", "s2"),
        ("old", "s2"),
        ("c", "s1"),
    ]
    # The whole batch again: nothing new, every answer from the stored rows.
    again = outcome(run(store.enqueue(batch)))
    assert [r[3] for r in again] == [False] * len(batch)
    assert again[1][4] == "payload_conflict" and again[3][4] == "too_large"


@pytest.mark.parametrize("by_seq", [False, True], ids=["by-key", "by-seq"])
def test_batch_of_one_thousand_rows(store: MailboxStore, by_seq: bool) -> None:
    # By seq is how a relay acks what it read (one array on PostgreSQL, as the keys).
    gen = run(store.claim_host(RECIPIENT))
    sender_gen = run(store.claim_host(SENDER))
    batch = [item(f"m{i:04}", f"s{i % 3}") for i in range(1000)]
    results = run(store.enqueue(batch))
    assert all(r.inserted and r.state == "queued" for r in results)
    rows = run(store.fetch_inbound(RECIPIENT, gen, limit=1000))
    assert [r.message_id for r in rows] == [f"m{i:04}" for i in range(1000)]
    acks = [
        Ack(r.message_id, r.recipient_session, "delivered", seq=r.seq if by_seq else None)
        for r in rows
    ]
    assert run(store.ack(RECIPIENT, gen, acks)) == 1000
    assert run(store.ack(RECIPIENT, gen, acks)) == 0
    assert len(run(store.receipts(SENDER, sender_gen, limit=2000))) == 1000


def test_batch_spanning_hosts_wakes_each_host(store: MailboxStore) -> None:
    hosts = ["h1@x", "h2@y", "h3@z"]
    gens = {h: run(store.claim_host(h)) for h in hosts}
    with store.waiter("h1@x") as w1, store.waiter("h3@z") as w3:
        assert w1.wait(1) and w3.wait(1)  # catch-up wake-ups
        run(store.enqueue([item(f"m{i}", host=hosts[i % 3]) for i in range(9)]))
        assert w1.wait(5) and w3.wait(5)
    for n, h in enumerate(hosts):
        assert [r.message_id for r in run(store.fetch_inbound(h, gens[h]))] == [
            f"m{i}" for i in range(n, 9, 3)
        ]


def test_ack_batch_mixed_outcomes_duplicates_and_finished_rows(store: MailboxStore) -> None:
    sender_gen = run(store.claim_host(SENDER))
    gen = run(store.claim_host(RECIPIENT))
    run(store.enqueue([item("m1"), item("m2"), item("m3"), item("m4"), item("x", host="carol@c")]))
    assert run(store.ack(RECIPIENT, gen, [Ack("m2", "s1", "delivered")])) == 1
    acks = [
        Ack("m1", "s1", "delivered"),
        Ack("m2", "s1", "refused", "late"),  # already finished: unchanged, no receipt
        Ack("m3", "s1", "refused", "not_found"),
        Ack("m1", "s1", "refused", "dup"),  # second ack of a row in the batch: the first wins
        Ack("x", "s1", "delivered"),  # another host's delivery: not ours to ack
        Ack("nope", "s1", "delivered"),
        Ack("m4", "s1", "refused", "too_big"),
    ]
    assert run(store.ack(RECIPIENT, gen, acks)) == 3
    states = {m: run(store.get_message(m)).states["s1"] for m in ("m1", "m2", "m3", "m4", "x")}  # type: ignore[union-attr]
    assert states == {
        "m1": "delivered",
        "m2": "delivered",
        "m3": "refused",
        "m4": "refused",
        "x": "queued",
    }
    got = [(r.message_id, r.outcome, r.code) for r in run(store.receipts(SENDER, sender_gen))]
    assert got == [
        ("m2", "delivered", None),
        ("m1", "delivered", None),
        ("m3", "refused", "not_found"),
        ("m4", "refused", "too_big"),
    ]
    assert run(store.ack(RECIPIENT, gen - 1, [Ack("x", "s1", "delivered")])) == 0


def test_settings_are_cached_for_a_short_time(
    store_url: str, store: MailboxStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = run(open_store(store_url))
    try:
        assert run(store.enqueue([item("warm")]))[0].inserted  # caches the settings
        run(other.update_settings(max_message_bytes=5))  # type: ignore[attr-defined]
        # Within the refresh interval the cached limit still applies...
        assert run(store.enqueue([item("m1", size=10)]))[0].inserted
        # ...after it, the new one does; the store that changed it sees it at once.
        monkeypatch.setattr(sqlstore, "SETTINGS_TTL_S", 0.0)
        assert run(store.enqueue([item("m2", size=10)]))[0].code == "too_large"
        assert run(other.enqueue([item("m3", size=10)]))[0].code == "too_large"
    finally:
        run(other.aclose())
