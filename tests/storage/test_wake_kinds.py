"""Wake-ups name what to look at, receipts ride in the hint on PostgreSQL, and the heartbeat's
answer carries the leases, roster revisions and the poll backstop's probe (docs/storage.md)."""

from __future__ import annotations

import psycopg
import pytest

from crossintercom.models import SessionInfo
from crossintercom.storage import Ack, LateReceipt, MailboxStore, Wake
from crossintercom.storage import queries as q
from crossintercom.storage.blocking import run
from crossintercom.storage.interface import CATCH_UP
from crossintercom.storage.wakeup import channel_name, parse_hint
from tests.storage.test_behaviour import RECIPIENT, SENDER, item


def _wake(waiter_wake: Wake | None) -> Wake:
    assert waiter_wake is not None
    return waiter_wake


def test_each_wake_names_its_kind(store: MailboxStore) -> None:
    gen = run(store.claim_host(RECIPIENT))
    sender_gen = run(store.claim_host(SENDER))
    with store.waiter(RECIPIENT) as recipient, store.waiter(SENDER) as sender:
        assert recipient.wake(1.0) == CATCH_UP and sender.wake(1.0) == CATCH_UP
        run(store.enqueue([item("k1")], generation=sender_gen))
        woke = _wake(recipient.wake(5.0))
        assert woke.deliveries and not woke.receipts and not woke.hinted
        assert sender.wake(0.3) is None  # nothing for the sender's host yet
        assert run(store.ack(RECIPIENT, gen, [Ack("k1", "s1", "delivered")])) == 1
        told = _wake(sender.wake(5.0))
        assert not told.deliveries
        [row] = run(store.receipts(SENDER, sender_gen))
        if told.hinted:  # PostgreSQL: the receipt itself, as the row holds it
            assert list(told.hinted) == [row] and not told.receipts
        else:  # SQLite: the kind only
            assert told.receipts
        assert recipient.wake(0.3) is None


@pytest.mark.pg
def test_late_receipts_are_hinted_with_their_sender(pg_url: str) -> None:
    from crossintercom.storage import open_store

    store = run(open_store(pg_url))
    try:
        gen = run(store.claim_host(RECIPIENT))
        sender_gen = run(store.claim_host(SENDER))
        run(store.enqueue([item("l1")], generation=sender_gen))
        run(store.ack(RECIPIENT, gen, [Ack("l1", "s1", "delivered")]))
        with store.waiter(SENDER) as waiter:
            assert waiter.wake(1.0) == CATCH_UP
            shown = LateReceipt("l1", "s1", SENDER, "planner", "shown")
            assert run(store.add_receipts(RECIPIENT, gen, [shown])) == 1
            hinted = _wake(waiter.wake(5.0)).hinted
            assert [(r.outcome, r.sender_session) for r in hinted] == [("shown", "planner")]
            assert {r.id for r in run(store.receipts(SENDER, sender_gen))} >= {hinted[0].id}
    finally:
        run(store.aclose())


@pytest.mark.pg
def test_a_batch_of_receipts_rides_in_several_hints(pg_url: str) -> None:
    from crossintercom.storage import open_store

    store = run(open_store(pg_url))
    try:
        gen = run(store.claim_host(RECIPIENT))
        sender_gen = run(store.claim_host(SENDER))
        run(store.enqueue([item(f"many-{i:04d}") for i in range(200)], generation=sender_gen))
        with store.waiter(SENDER) as waiter:
            assert waiter.wake(1.0) == CATCH_UP
            acks = [Ack(f"many-{i:04d}", "s1", "delivered") for i in range(200)]
            assert run(store.ack(RECIPIENT, gen, acks)) == 200
            hinted: list[str] = []
            while len(hinted) < 200:  # the hints may come over more than one wake-up
                woke = _wake(waiter.wake(5.0))
                assert not woke.receipts  # no read needed
                hinted += [r.message_id for r in woke.hinted]
        assert hinted == [f"many-{i:04d}" for i in range(200)]
        # The hints are the rows: nothing the store holds for the sender is missing from them.
        assert {r.message_id for r in run(store.receipts(SENDER, sender_gen, limit=500))} == set(
            hinted
        )
    finally:
        run(store.aclose())


@pytest.mark.pg
def test_a_long_receipt_hint_names_its_kind_only(pg_url: str) -> None:
    from crossintercom.storage import open_store

    store = run(open_store(pg_url))
    try:
        gen = run(store.claim_host(RECIPIENT))
        # Ids and sessions at their longest: one hint's share of receipts is over the limit.
        ids = [f"{i:02d}".ljust(128, "x") for i in range(q.PG_HINT_ROWS)]
        session = "s" * 64
        run(store.enqueue([item(mid, session) for mid in ids]))
        with store.waiter(SENDER) as waiter:
            assert waiter.wake(1.0) == CATCH_UP
            acks = [Ack(mid, session, "refused", "c" * 64) for mid in ids]
            assert run(store.ack(RECIPIENT, gen, acks)) == len(ids)
            woke = _wake(waiter.wake(5.0))
            assert woke.receipts and not woke.hinted
    finally:
        run(store.aclose())


@pytest.mark.pg
def test_the_sql_channel_is_the_python_one(pg_url: str) -> None:
    host = "höst@例え"
    expr = q._PG_CHANNEL.format("CAST(%s AS text)")
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
        row = conn.execute(f"SELECT {expr}", (host,)).fetchone()
    assert row is not None and row[0] == channel_name(host)


def test_a_published_roster_wakes_every_host(store: MailboxStore) -> None:
    gen = run(store.claim_host(RECIPIENT))
    sender_gen = run(store.claim_host(SENDER))
    with store.waiter(RECIPIENT) as recipient, store.waiter(SENDER) as sender:
        assert recipient.wake(1.0) == CATCH_UP and sender.wake(1.0) == CATCH_UP
        s = SessionInfo(id="s7", host=SENDER, name="planner")
        assert run(store.publish_sessions(SENDER, sender_gen, [s]))
        assert _wake(recipient.wake(5.0)) == Wake(roster=True)
        assert _wake(sender.wake(5.0)) == Wake(roster=True)  # its own too: one hint for all
        assert not run(store.publish_sessions(RECIPIENT, gen - 1, []))  # fenced: no hint
        assert recipient.wake(0.3) is None and sender.wake(0.3) is None


def test_hints_parse_by_kind() -> None:
    assert parse_hint("d") == Wake(deliveries=True)
    assert parse_hint("r") == Wake(receipts=True)
    assert parse_hint("o") == Wake(roster=True)
    assert parse_hint("") == CATCH_UP
    assert parse_hint("R[not json") == Wake(receipts=True)
    [row] = parse_hint('R[[7,"m","s","h","refused","bad",null]]').hinted
    assert (row.id, row.outcome, row.code, row.sender_session) == (7, "refused", "bad", None)
    # with an acknowledgement's note; a hint without it is an older writer's
    [acked] = parse_hint('R[[8,"m","s","h","acknowledged",null,"bs","done"]]').hinted
    assert (acked.id, acked.outcome, acked.sender_session, acked.note) == (
        8, "acknowledged", "bs", "done",
    )  # fmt: skip
    assert row.note is None


def test_beat_carries_leases_roster_revisions_and_the_probe(store: MailboxStore) -> None:
    gen = run(store.claim_host(RECIPIENT))
    sender_gen = run(store.claim_host(SENDER))
    first = run(store.beat(RECIPIENT, gen, ["s1"]))
    assert first is not None and not first.deliveries_waiting and not first.receipts_waiting
    assert first.archive_enabled is False  # no archive setting row: off
    revs = {h.host_id: h.roster_rev for h in first.hosts}
    assert set(revs) == {RECIPIENT, SENDER}

    s = SessionInfo(id="s9", host=SENDER, name="n")
    assert run(store.publish_sessions(SENDER, sender_gen, [s]))
    run(store.enqueue([item("p1")], generation=sender_gen))
    beat = run(store.beat(RECIPIENT, gen, ["s1"]))
    assert beat is not None and beat.deliveries_waiting
    moved = {h.host_id: h.roster_rev for h in beat.hosts}
    assert moved[SENDER] == revs[SENDER] + 1 and moved[RECIPIENT] == revs[RECIPIENT]
    other = run(store.beat(RECIPIENT, gen, ["s2"]))  # rows for a session not ours do not count
    assert other is not None and not other.deliveries_waiting

    run(store.ack(RECIPIENT, gen, [Ack("p1", "s1", "delivered")]))
    sender_beat = run(store.beat(SENDER, sender_gen, []))
    assert sender_beat is not None and sender_beat.receipts_waiting
    run(
        store.consume_receipts(
            SENDER, sender_gen, [r.id for r in run(store.receipts(SENDER, sender_gen))]
        )
    )
    after = run(store.beat(SENDER, sender_gen, []))
    assert after is not None and not after.receipts_waiting

    heartbeats = {h.host_id: h.heartbeat for h in run(store.hosts())}
    assert run(store.beat(RECIPIENT, gen - 1, ["s1"])) is None  # fenced: nothing bumped
    assert {h.host_id: h.heartbeat for h in run(store.hosts())} == heartbeats
