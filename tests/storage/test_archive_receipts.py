"""The archive's receipts on both backends (docs/archive.md, "Receipts"): a recipient's outcome
only moves further along (queued, delivered, shown, acknowledged; failures final), whatever
order the hosts' copies arrive in; a later receipt from a recipient's host moves only that
host's recipients' rows; an ask's wait written by its sender's host survives a recipient's
copy written first, and no copy naming another sender's host replaces it.
"""

from __future__ import annotations

from crossintercom.models import Message, Peer
from crossintercom.storage import (
    ArchiveEntry,
    ArchiveRecipient,
    ReceiptUpdate,
)
from tests.archive_sync import SyncArchive


def msg(mid: str, host: str = "hostB", *, ask: bool = False) -> Message:
    return Message(mid, Peer("sid-bob", "bob", host), "carol@hostC", "hello", expects_reply=ask)


def carol(outcome: str, code: str | None = None) -> tuple[ArchiveRecipient, ...]:
    return (ArchiveRecipient("sid-carol", "hostC", outcome, "carol", code),)


def outcome(archive: SyncArchive, mid: str, sid: str = "sid-carol") -> str:
    return str({r.session_id: r.outcome for r in archive.receipts_of([mid])[mid]}[sid])


def test_an_outcome_never_goes_back_whatever_order_the_copies_arrive_in(
    archive: SyncArchive,
) -> None:
    # The recipient's host said delivered; the sender's host's queued comes later.
    archive.archive([ArchiveEntry(msg("m1"), carol("delivered"))])
    archive.archive([ArchiveEntry(msg("m1"), carol("queued"))])
    assert outcome(archive, "m1") == "delivered"
    # Shown, then a late delivered (the other host's copy): still shown; then acknowledged.
    archive.archive([ArchiveEntry(msg("m1"), carol("shown"))])
    archive.archive([ArchiveEntry(msg("m1"), carol("delivered"))])
    assert outcome(archive, "m1") == "shown"
    archive.archive([ArchiveEntry(msg("m1"), carol("acknowledged"))])
    assert outcome(archive, "m1") == "acknowledged"
    # Within one batch too.
    archive.archive(
        [ArchiveEntry(msg("m2"), carol("delivered")), ArchiveEntry(msg("m2"), carol("queued"))]
    )
    assert outcome(archive, "m2") == "delivered"
    # Queued, then expired: final, with its code; nothing moves it afterwards.
    archive.archive([ArchiveEntry(msg("m3"), carol("queued"))])
    archive.archive([ArchiveEntry(msg("m3"), carol("expired", "expired"))])
    archive.archive([ArchiveEntry(msg("m3"), carol("delivered"))])
    [r] = archive.receipts_of(["m3"])["m3"]
    assert (r.outcome, r.code) == ("expired", "expired")


def test_a_later_receipt_moves_only_its_own_hosts_recipients_forward(
    archive: SyncArchive,
) -> None:
    to_both = (*carol("delivered"), ArchiveRecipient("sid-dan", "hostD", "delivered", "dan"))
    archive.archive([ArchiveEntry(msg("m1"), to_both)])
    # C's relay: carol was shown it.
    archive.archive([ReceiptUpdate("m1", "sid-carol", "hostC", "shown")])
    assert outcome(archive, "m1") == "shown"
    # C's relay about dan, who is on D: nothing (and so for B, the sender, writing one).
    archive.archive([ReceiptUpdate("m1", "sid-dan", "hostC", "shown")])
    archive.archive([ReceiptUpdate("m1", "sid-dan", "hostB", "expired", "expired")])
    assert outcome(archive, "m1", "sid-dan") == "delivered"
    # Nor a copy that places dan on C.
    archive.archive([ArchiveEntry(msg("m1"), (ArchiveRecipient("sid-dan", "hostC", "shown"),))])
    assert outcome(archive, "m1", "sid-dan") == "delivered"
    # Never back, and never into a final one.
    archive.archive([ReceiptUpdate("m1", "sid-carol", "hostC", "delivered")])
    assert outcome(archive, "m1") == "shown"
    archive.archive([ReceiptUpdate("m1", "sid-dan", "hostD", "shown")])
    archive.archive([ReceiptUpdate("m1", "sid-dan", "hostD", "acknowledged")])
    assert outcome(archive, "m1", "sid-dan") == "acknowledged"
    # A receipt for a message or a recipient the archive does not hold makes no row.
    archive.archive([ReceiptUpdate("absent", "sid-carol", "hostC", "shown")])
    archive.archive([ReceiptUpdate("m1", "sid-erin", "hostC", "shown")])
    assert archive.receipts_of(["absent"]) == {}
    assert {r.session_id for r in archive.receipts_of(["m1"])["m1"]} == {"sid-carol", "sid-dan"}
    # The copy and its later receipt in one batch: in order.
    archive.archive(
        [
            ArchiveEntry(msg("m2"), carol("delivered")),
            ReceiptUpdate("m2", "sid-carol", "hostC", "shown"),
        ]
    )
    assert outcome(archive, "m2") == "shown"


def test_an_asks_wait_from_its_senders_host_survives_a_recipients_copy(
    archive: SyncArchive,
) -> None:
    # The recipient's host is often first: its copy has no wait.
    archive.archive([ArchiveEntry(msg("ask", ask=True), carol("delivered"))])
    archive.archive([ArchiveEntry(msg("ask", ask=True), carol("delivered"), wait_s=90.0)])
    archive.archive([ArchiveEntry(msg("ask", ask=True), carol("delivered"))])
    [row] = [m for m in archive.feed(0) if m.message.id == "ask"]
    assert row.wait_s == 90.0
    # A copy that names another sender's host replaces nothing.
    archive.archive([ArchiveEntry(msg("ask", "hostX", ask=True), carol("delivered"), wait_s=1.0)])
    [row] = [m for m in archive.feed(0) if m.message.id == "ask"]
    assert (row.wait_s, row.message.sender.host) == (90.0, "hostB")
    # Read back the same way in a thread; the message itself is unchanged.
    [in_thread] = archive.thread("ask")
    assert (in_thread.wait_s, in_thread.message) == (90.0, row.message)


def test_receipts_of_many_messages_are_read_in_bounded_lists(archive: SyncArchive) -> None:
    ids = [f"many{i}" for i in range(1200)]
    archive.archive([ArchiveEntry(msg(mid), carol("delivered")) for mid in ids])
    found = archive.receipts_of([*ids, "absent"])
    assert set(found) == set(ids)
