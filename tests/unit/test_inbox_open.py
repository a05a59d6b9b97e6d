"""Two connections opening one fresh inbox at once (a listener's display and its client)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from crossintercom.errors import InboxUnavailable
from crossintercom.inbox import Inbox
from crossintercom.models import Message, Peer


def _message(n: int) -> Message:
    sender = Peer(id="s-1", name="planner", host="h1")
    return Message(id=f"m-{n}", sender=sender, to="worker", text=f"text {n}")


def test_concurrent_first_open_never_reports_locked(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    for round_ in range(60):
        directory = tmp_path / str(round_)
        barrier = threading.Barrier(2)

        def open_and_save(
            n: int, directory: Path = directory, barrier: threading.Barrier = barrier
        ) -> None:
            barrier.wait()
            try:
                with Inbox(directory, "worker-session") as box:
                    box.save(_message(n))
            except (sqlite3.Error, InboxUnavailable) as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_and_save, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with Inbox.view(directory, "worker-session") as box:
            assert box.count() == 2
    assert errors == []
