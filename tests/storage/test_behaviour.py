"""The store contract, run against every backend (SQLite file and PostgreSQL)."""

from __future__ import annotations

import json
import time

import pytest

from crossintercom.errors import StoreFenced
from crossintercom.models import SessionInfo
from crossintercom.storage import Ack, MailboxStore, OutboundItem, StoreSettings
from crossintercom.storage.blocking import run
from tests.storage.conftest import spawn_worker

SENDER, RECIPIENT = "alice@a", "bob@b"


def item(
    mid: str,
    session: str = "s1",
    *,
    digest: str = "d" * 64,
    size: int = 10,
    host: str = RECIPIENT,
) -> OutboundItem:
    return OutboundItem(mid, SENDER, host, session, digest, {"id": mid, "message": "hi"}, size)


def test_enqueue_is_idempotent_and_refuses_conflicts(store: MailboxStore) -> None:
    first = run(store.enqueue([item("m1"), item("m1", "s2")]))
    assert [(r.state, r.inserted, r.code) for r in first] == [("queued", True, None)] * 2

    again = run(store.enqueue([item("m1")]))
    assert [(r.state, r.inserted, r.code) for r in again] == [("queued", False, None)]

    conflict = run(store.enqueue([item("m1", digest="e" * 64)]))
    assert [(r.state, r.inserted, r.code) for r in conflict] == [
        ("refused", False, "payload_conflict")
    ]
    row = run(store.get_message("m1"))
    assert row is not None
    assert row.digest == "d" * 64
    assert row.states == {"s1": "queued", "s2": "queued"}
    assert run(store.get_message("nope")) is None


def test_too_large_writes_nothing(store: MailboxStore) -> None:
    assert run(store.settings()) == StoreSettings(1_048_576, 7 * 86400)
    [result] = run(store.enqueue([item("big", size=1_048_577)]))
    assert (result.state, result.inserted, result.code) == ("refused", False, "too_large")
    assert run(store.get_message("big")) is None


def test_claim_in_seq_order_and_by_session(store: MailboxStore) -> None:
    gen = run(store.claim_host(RECIPIENT))
    run(store.enqueue([item(f"m{i}", f"s{i % 2}") for i in range(6)]))
    run(store.enqueue([item("other", host="carol@c")]))
    rows = run(store.fetch_inbound(RECIPIENT, gen))
    assert [r.message_id for r in rows] == [f"m{i}" for i in range(6)]
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)
    assert rows[0].text is not None and json.loads(rows[0].text) == {"id": "m0", "message": "hi"}
    assert rows[0].sender_host == SENDER
    assert len(run(store.fetch_inbound(RECIPIENT, gen, limit=2))) == 2
    only_s1 = run(store.fetch_inbound(RECIPIENT, gen, session_ids=["s1"]))
    assert [r.message_id for r in only_s1] == ["m1", "m3", "m5"]
    assert run(store.fetch_inbound(RECIPIENT, gen, session_ids=[])) == []
    # Not marked claimed: a reader that crashed before acking leaves them for the next one.
    assert len(run(store.fetch_inbound(RECIPIENT, gen))) == 6


def test_a_read_leaves_out_the_seqs_it_is_told_to_skip(store: MailboxStore) -> None:
    """The relay's read ahead names the rows in flight: the statement leaves them out, and the
    limit counts only the rows it returns; the fence still holds."""
    gen = run(store.claim_host(RECIPIENT))
    run(store.enqueue([item(f"m{i}", f"s{i % 2}") for i in range(8)]))
    seqs = [r.seq for r in run(store.fetch_inbound(RECIPIENT, gen))]
    ahead = run(store.fetch_inbound(RECIPIENT, gen, limit=3, skip_seqs=seqs[:4]))
    assert [r.message_id for r in ahead] == ["m4", "m5", "m6"]
    scattered = run(store.fetch_inbound(RECIPIENT, gen, skip_seqs=[seqs[1], seqs[6], 10**12]))
    assert [r.message_id for r in scattered] == ["m0", "m2", "m3", "m4", "m5", "m7"]
    only_s1 = run(store.fetch_inbound(RECIPIENT, gen, session_ids=["s1"], skip_seqs=seqs[:4]))
    assert [r.message_id for r in only_s1] == ["m5", "m7"]
    assert run(store.fetch_inbound(RECIPIENT, gen, skip_seqs=seqs)) == []
    assert len(run(store.fetch_inbound(RECIPIENT, gen, skip_seqs=[]))) == 8
    run(store.claim_host(RECIPIENT))
    assert run(store.fetch_inbound(RECIPIENT, gen, skip_seqs=seqs[:1])) == []


def test_newer_generation_fences_the_older(store: MailboxStore) -> None:
    old = run(store.claim_host(RECIPIENT))
    new = run(store.claim_host(RECIPIENT))
    assert new == old + 1
    run(store.enqueue([item("m1")]))
    session = SessionInfo(id="s1", host=RECIPIENT, name="bob")

    assert run(store.fetch_inbound(RECIPIENT, old)) == []
    assert run(store.ack(RECIPIENT, old, [Ack("m1", "s1", "delivered")])) == 0
    assert run(store.heartbeat(RECIPIENT, old)) is False
    assert run(store.publish_sessions(RECIPIENT, old, [session])) is False
    assert run(store.get_message("m1")).states == {"s1": "queued"}  # type: ignore[union-attr]
    assert run(store.roster()) == []

    assert run(store.heartbeat(RECIPIENT, new)) is True
    assert run(store.publish_sessions(RECIPIENT, new, [session])) is True
    assert [r.message_id for r in run(store.fetch_inbound(RECIPIENT, new))] == ["m1"]
    assert run(store.ack(RECIPIENT, new, [Ack("m1", "s1", "delivered")])) == 1
    hosts = {h.host_id: h for h in run(store.hosts())}
    assert (hosts[RECIPIENT].generation, hosts[RECIPIENT].heartbeat) == (new, 1)


def test_stale_generation_cannot_enqueue(store: MailboxStore) -> None:
    old = run(store.claim_host(SENDER))
    new = run(store.claim_host(SENDER))
    with pytest.raises(StoreFenced):
        run(store.enqueue([item("late")], generation=old))
    assert run(store.get_message("late")) is None
    [ok] = run(store.enqueue([item("current")], generation=new))
    assert (ok.state, ok.inserted) == ("queued", True)


def test_ack_writes_one_receipt_and_is_idempotent(store: MailboxStore) -> None:
    sender_gen = run(store.claim_host(SENDER))
    gen = run(store.claim_host(RECIPIENT))
    run(store.enqueue([item("m1"), item("m1", "s2"), item("m2")]))
    acks = [Ack("m1", "s1", "delivered"), Ack("m1", "s2", "refused", "not_found")]
    assert run(store.ack(RECIPIENT, gen, acks)) == 2
    assert run(store.ack(RECIPIENT, gen, acks)) == 0
    assert run(store.ack(RECIPIENT, gen, [Ack("m1", "s1", "refused", "late")])) == 0
    assert run(store.get_message("m1")).states == {"s1": "delivered", "s2": "refused"}  # type: ignore[union-attr]

    receipts = run(store.receipts(SENDER, sender_gen))
    assert [
        (r.message_id, r.recipient_session, r.recipient_host, r.outcome, r.code) for r in receipts
    ] == [
        ("m1", "s1", RECIPIENT, "delivered", None),
        ("m1", "s2", RECIPIENT, "refused", "not_found"),
    ]
    assert run(store.receipts(SENDER, sender_gen - 1)) == []  # receipts are fenced too
    run(store.consume_receipts(SENDER, sender_gen, [receipts[0].id]))
    assert [r.id for r in run(store.receipts(SENDER, sender_gen))] == [receipts[1].id]
    # A finished delivery answers a retry of the same id with its state, not a new row.
    [retry] = run(store.enqueue([item("m1")]))
    assert (retry.state, retry.inserted) == ("delivered", False)
    assert [r.message_id for r in run(store.fetch_inbound(RECIPIENT, gen))] == ["m2"]


def test_expiry_writes_expired_receipts(store: MailboxStore) -> None:
    sender_gen = run(store.claim_host(SENDER))
    run(store.update_settings(retention_s=0))  # type: ignore[attr-defined]
    run(store.enqueue([item("m1"), item("m2")]))
    run(store.update_settings(retention_s=3600))  # type: ignore[attr-defined]
    run(store.enqueue([item("m3")]))
    time.sleep(0.01)
    assert run(store.expire()) == 2
    assert run(store.expire()) == 0
    assert run(store.get_message("m1")).states == {"s1": "expired"}  # type: ignore[union-attr]
    assert run(store.get_message("m3")).states == {"s1": "queued"}  # type: ignore[union-attr]
    outcomes = {(r.message_id, r.outcome) for r in run(store.receipts(SENDER, sender_gen))}
    assert outcomes == {("m1", "expired"), ("m2", "expired")}


def test_purge_in_batches_keeps_queued_rows(store: MailboxStore) -> None:
    gen = run(store.claim_host(RECIPIENT))
    run(store.enqueue([item(f"m{i}") for i in range(25)]))
    run(store.enqueue([item("m0", "s2")]))  # m0 keeps a queued delivery
    run(store.ack(RECIPIENT, gen, [Ack(f"m{i}", "s1", "delivered") for i in range(25)]))
    assert run(store.purge(batch=1000)) == 0  # finished rows stay for the retention period
    purged = run(store.purge(batch=7, older_than_s=0))
    assert purged == 50  # 25 deliveries + 25 unconsumed receipts
    assert run(store.get_message("m1")) is None
    assert run(store.get_message("m0")).states == {"s2": "queued"}  # type: ignore[union-attr]


def test_roster_publish_replaces_this_hosts_sessions(store: MailboxStore) -> None:
    ga, gb = run(store.claim_host("a")), run(store.claim_host("b"))
    s1 = SessionInfo(id="1", host="ignored", name="one", groups=("x", "y"), durable=True)
    s2 = SessionInfo(id="2", host="ignored", name=None, online=False, status="busy")
    s3 = SessionInfo(id="3", host="ignored", name="one", groups=("x", "y"), durable=True)
    assert run(store.publish_sessions("a", ga, [s1, s2]))
    assert run(store.publish_sessions("b", gb, [s3, s2]))  # "2" is a's: left out
    assert run(store.publish_sessions("a", ga, [s2]))
    roster = run(store.roster())
    assert [(s.host, s.id) for s in roster] == [("a", "2"), ("b", "3")]
    assert roster[0].online is False and roster[0].status == "busy"
    assert roster[1].groups == ("x", "y") and roster[1].durable is True
    assert run(store.publish_sessions("a", ga, []))
    assert [s.host for s in run(store.roster())] == ["b"]


def test_waiter_reports_catch_up_then_times_out(store: MailboxStore) -> None:
    with store.waiter(RECIPIENT) as waiter:
        assert waiter.wait(1.0) is True  # first wait: run the catch-up query
        start = time.monotonic()
        assert waiter.wait(0.3) is False
        assert time.monotonic() - start >= 0.25
        waiter.notify_self()
        assert waiter.wait(2.0) is True


def test_waiter_in_another_process_is_woken_by_enqueue(store_url: str, store: MailboxStore) -> None:
    proc = spawn_worker("wait", store_url, RECIPIENT, "10", "inotify")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()  # type: ignore[union-attr]
        run(store.enqueue([item("wake")]))
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
        proc.wait()
    verdict, elapsed = out.split()
    assert verdict == "woken", err
    assert float(elapsed) < 1.0
