"""An inbox file made immutable under its ``Inbox`` (real file, ``chattr +i``): operations raise
``inbox_unavailable`` and record the fault; marks that cannot be written are held in the
process, so nothing is shown twice, and written once the file works again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crossintercom.errors import InboxUnavailable
from crossintercom.inbox import Inbox
from crossintercom.models import Message, Peer
from crossintercom.tools.chaos.disk import chattr
from tests.inbox_fault import NEEDS_ROOT

pytestmark = NEEDS_ROOT


def _message(n: int) -> Message:
    return Message(id=f"m-{n}", sender=Peer("s-1", "planner", "h1"), to="worker", text=f"{n}")


def test_marks_held_while_immutable_and_written_after(tmp_path: Path) -> None:
    changes: list[set[str]] = []
    with Inbox(tmp_path, "worker") as box:
        box.faults.on_change = lambda: changes.append(set(box.faults.current))
        box.save_many([(_message(n), False) for n in range(3)])
        first = box.unshown()
        path = tmp_path / "worker.sqlite"
        assert chattr("+i", path) is None
        try:
            assert box.mark_shown([first[0].seq]) is False  # shown, not marked: held here
            with pytest.raises(InboxUnavailable) as err:
                box.save(_message(9))
            assert err.value.code == "inbox_unavailable"
            with pytest.raises(InboxUnavailable):  # the failed save's journal needs a write
                box.unshown()
            assert box.recheck() is not None
            assert changes[0] == {"write"}
        finally:
            assert chattr("-i", path) is None
        assert [e.id for e in box.unshown()] == ["m-1", "m-2"]  # m-0 is not shown again
        assert box.recheck() is None
        assert changes[-1] == set()
    with Inbox.view(tmp_path, "worker") as view:
        assert [e.id for e in view.unshown()] == ["m-1", "m-2"]  # the held mark was written
        assert view.count() == 3


def test_a_write_fault_clears_only_by_a_write_that_works(tmp_path: Path) -> None:
    with Inbox(tmp_path, "worker") as box:
        path = tmp_path / "worker.sqlite"
        assert chattr("+i", path) is None
        try:
            with pytest.raises(InboxUnavailable):
                box.save(_message(1))
            assert set(box.faults.current) == {"write"}
            assert box.recheck() is not None  # tried with a real write, which fails too
            assert "write" in box.faults.current
        finally:
            assert chattr("-i", path) is None
        assert box.recheck() is None
        assert box.save(_message(1)) is True


_KILLED_MID_COMMIT = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=TRUNCATE")
db.execute("PRAGMA cache_size=1")  # spill to the file, so the journal holds pages
db.execute("BEGIN")
for i in range(2000):
    db.execute(
        "INSERT INTO entries (id, kind, body, received_at) VALUES (?, 'message', ?, 0)",
        (str(i), "x" * 500),
    )
os._exit(9)
"""


def test_a_journal_left_by_a_killed_writer_is_a_read_fault_until_its_owner_opens_it(
    tmp_path: Path,
) -> None:
    """A viewer cannot roll back another process's journal: it is told inbox_unavailable (a
    fault it can wait out), never a raw database error; the owner's next open repairs it."""
    Inbox(tmp_path, "s").close()
    path = tmp_path / "s.sqlite"
    subprocess.run([sys.executable, "-c", _KILLED_MID_COMMIT, str(path)], check=False)
    assert Path(f"{path}-journal").stat().st_size > 0  # hot: the writer died mid-commit
    with pytest.raises(InboxUnavailable):
        Inbox.view(tmp_path, "s")
    Inbox(tmp_path, "s").close()  # its owner opens it: the journal is rolled back
    with Inbox.view(tmp_path, "s") as viewer:
        assert list(viewer.messages()) == []
