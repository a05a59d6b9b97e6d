"""The store's late receipts (`shown`, a late `expired`) and `forget_session`, on every backend."""

from __future__ import annotations

from crossintercom.models import SessionInfo
from crossintercom.storage import Ack, LateReceipt, MailboxStore
from crossintercom.storage.blocking import run
from tests.storage.test_behaviour import RECIPIENT, SENDER, item


def test_late_receipts_name_the_sender_session_and_are_fenced(store: MailboxStore) -> None:
    sender_gen = run(store.claim_host(SENDER))
    gen = run(store.claim_host(RECIPIENT))
    run(store.enqueue([item("m1")]))
    assert run(store.ack(RECIPIENT, gen, [Ack("m1", "s1", "delivered")])) == 1
    shown = LateReceipt("m1", "s1", SENDER, "alice-session", "shown")
    assert run(store.add_receipts(RECIPIENT, gen, [shown])) == 1
    rows = run(store.receipts(SENDER, sender_gen))
    assert [(r.message_id, r.outcome, r.sender_session) for r in rows] == [
        ("m1", "delivered", None),
        ("m1", "shown", "alice-session"),
    ]
    assert rows[1].recipient_host == RECIPIENT  # written as the recipient's host, always
    run(store.consume_receipts(SENDER, sender_gen, [r.id for r in rows]))
    # A relay that was taken over writes nothing.
    run(store.claim_host(RECIPIENT))
    late = LateReceipt("m1", "s1", SENDER, "alice-session", "expired", "expired")
    assert run(store.add_receipts(RECIPIENT, gen, [late])) == 0
    assert run(store.receipts(SENDER, sender_gen)) == []


def test_forget_session_expires_its_queued_rows_and_its_roster_row(store: MailboxStore) -> None:
    sender_gen = run(store.claim_host(SENDER))
    gen = run(store.claim_host(RECIPIENT))
    bob, carol = (SessionInfo(id=s, host=RECIPIENT, name=s, durable=True) for s in ("s1", "s2"))
    assert run(store.publish_sessions(RECIPIENT, gen, [bob, carol]))
    run(store.enqueue([item("m1"), item("m2"), item("m3", "s2")]))
    assert run(store.ack(RECIPIENT, gen, [Ack("m2", "s1", "delivered")])) == 1

    assert run(store.forget_session(RECIPIENT, gen + 1, "s1")) == 0  # stale: nothing
    assert run(store.forget_session(RECIPIENT, gen, "s1")) == 1
    assert run(store.get_message("m1")).states == {"s1": "expired"}  # type: ignore[union-attr]
    assert run(store.get_message("m3")).states == {"s2": "queued"}  # type: ignore[union-attr]
    assert [s.id for s in run(store.roster())] == ["s2"]
    rows = run(store.receipts(SENDER, sender_gen))
    assert [(r.message_id, r.outcome, r.code) for r in rows] == [
        ("m2", "delivered", None),
        ("m1", "expired", "forgotten"),
    ]
    assert [r.message_id for r in run(store.fetch_inbound(RECIPIENT, gen))] == ["m3"]
