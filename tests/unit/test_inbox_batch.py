"""``Inbox.save_many``: one transaction for a group of deliveries and notices, in order."""

from __future__ import annotations

from pathlib import Path

from crossintercom.inbox import Inbox
from crossintercom.models import Message, Outcome, Peer, Receipt


def _message(n: int) -> Message:
    return Message(
        id=f"m{n}", sender=Peer("s1", "planner", "alpha"), to="worker", text=f"hello {n}"
    )


def test_a_group_is_saved_in_arrival_order_and_each_once(tmp_path: Path) -> None:
    receipt = Receipt("m9", Outcome.SHOWN, "s2")
    # Each built once: a message's sent_at is the time it was built.
    m0, m1, m2 = _message(0), _message(1), _message(2)
    with Inbox(tmp_path, "worker") as box:
        assert box.save(m0)
        new = box.save_many([(m1, False), (receipt, False), (m0, False), (m2, True)])
        assert new == [True, True, False, True]
        entries = box.transcript()
        assert [(e.kind, e.id, e.shown) for e in entries] == [
            ("message", "m0", False),
            ("message", "m1", False),
            ("receipt", receipt.key, False),
            ("message", "m2", True),
        ]
        assert entries[1].body == m1.to_dict()
        assert entries[2].body == {"type": "receipt", **receipt.to_dict()}


def test_a_running_count_reads_only_what_is_new(tmp_path: Path) -> None:
    """``count_after``, the bench's poll: messages saved after a seq (receipts not counted),
    and the seq to ask from next; the same count as ``count`` summed over the polls."""
    with Inbox(tmp_path, "worker") as box:
        assert box.count_after(0) == (0, 0)
        box.save_many([(_message(0), False), (Receipt("m0", Outcome.SHOWN, "s2"), False)])
        new, last = box.count_after(0)
        assert new == 1 and last == 2
        assert box.count_after(last) == (0, last)
        box.save_many([(_message(1), False), (_message(2), False), (_message(1), False)])
        more, last = box.count_after(last)
        assert more == 2 and new + more == box.count() == 3
        with Inbox.view(tmp_path, "worker") as view:
            assert view.count_after(0) == (3, last)
