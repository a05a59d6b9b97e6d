"""What a relay's archive writer lets its host say (docs/archive.md, "Receipts"): receipts
about its own sessions' messages and about deliveries to its own sessions, nothing else, and an
ask's wait only for an ask its own host sent; a broker that claims more (a confused or hostile
one) gets the rest dropped before the store is touched."""

from __future__ import annotations

from collections.abc import Sequence

from crossintercom import protocol as p
from crossintercom.models import Message, Outcome, Peer, Receipt
from crossintercom.relay.archiver import Archiver
from crossintercom.storage import ArchiveEntry, ReceiptUpdate
from crossintercom.storage.blocking import run


class Recorder:
    url_masked = "memory"

    def __init__(self) -> None:
        self.batches: list[list[ArchiveEntry | ReceiptUpdate]] = []

    async def archive(self, entries: Sequence[ArchiveEntry | ReceiptUpdate]) -> int:
        self.batches.append(list(entries))
        return len(entries)


def written(frames: list[p.ArchiveCopy | p.ArchiveReceipts]) -> list[ArchiveEntry | ReceiptUpdate]:
    async def go() -> list[ArchiveEntry | ReceiptUpdate]:
        store = Recorder()
        archiver = Archiver(store, "C")  # type: ignore[arg-type]
        archiver.settle(True)
        for f in frames:
            archiver.put(f)
        out: list[ArchiveEntry | ReceiptUpdate] = []
        while len(out) < len(frames):
            out += await archiver._take(timeout=1.0)
        return out

    return run(go())  # a loop of its own: another test's may be running in this thread


def test_a_relay_archives_only_what_its_host_may_say() -> None:
    from_b = Message("m1", Peer("sid-b", "bob", "B"), "group:all", "hi", expects_reply=True)
    mine = Message("m2", Peer("sid-c", "carol", "C"), "dan@D", "ask", expects_reply=True)
    got = written(
        [
            # C received B's message: its own recipient counts; D's does not, nor B's wait.
            p.ArchiveCopy(
                from_b,
                [
                    Receipt("m1", Outcome.DELIVERED, "sid-c2", host="C"),
                    Receipt("m1", Outcome.SHOWN, "sid-d", host="D"),
                ],
                wait_s=5.0,
            ),
            # C's own ask: every recipient, and its wait.
            p.ArchiveCopy(mine, [Receipt("m2", Outcome.QUEUED, "sid-d", host="D")], 30.0),
            # A later receipt names C as the recipient's host whatever the frame says.
            p.ArchiveReceipts([p.ArchiveReceipt("m1", "sid-d", "shown")]),
        ]
    )
    first, second, update = got
    assert isinstance(first, ArchiveEntry) and isinstance(second, ArchiveEntry)
    assert [(r.session_id, r.host_id) for r in first.recipients] == [("sid-c2", "C")]
    assert first.wait_s is None
    assert [(r.session_id, r.host_id) for r in second.recipients] == [("sid-d", "D")]
    assert second.wait_s == 30.0
    assert update == ReceiptUpdate("m1", "sid-d", "C", "shown")
