"""Files and tables that would only grow stay within their documented bounds
(docs/operations.md, "Bounded files"), and a doorbell that cannot be rung loses nothing."""

from __future__ import annotations

import sqlite3
import subprocess
import uuid
from pathlib import Path

from sqlalchemy import create_engine, func, select

from crossintercom.inbox import Inbox
from crossintercom.models import Message, Peer
from crossintercom.runtime import bound_wal, truncate_wal
from crossintercom.storage.tables import deliveries, messages
from crossintercom.storage.wakeup import doorbell_dir
from tests.relay.conftest import Cluster, wait_for
from tests.relay.faultkit import ACKED, settle, stream


def _message(text: str = "x" * 200) -> Message:
    return Message(id=str(uuid.uuid4()), sender=Peer(id="s", name="n", host="h"), text=text)


def test_inbox_pruned_to_its_bound_keeping_unshown(tmp_path: Path) -> None:
    box = Inbox(tmp_path, "sess", max_entries=50)
    shown = [_message() for _ in range(300)]
    for m in shown:
        box.save(m, shown=True)
    unshown = [_message() for _ in range(80)]
    for m in unshown:
        box.save(m)
    box.prune()
    held = {e.id for e in box.messages()}
    # Never-shown mail is kept whatever the bound; shown entries are pruned oldest first.
    assert {m.id for m in unshown} <= held
    assert len(held - {m.id for m in unshown}) == 0
    assert not box.has(shown[0].id)
    box.close()
    again = Inbox(tmp_path, "sess", max_entries=50)  # pruned at open too
    assert again.count() == 80
    again.close()


def test_wal_checkpoint_policy_bounds_the_wal(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "w.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    bound_wal(db, 64 * 1024)
    db.execute("CREATE TABLE t (v TEXT)")
    wal = tmp_path / "w.sqlite-wal"
    for _ in range(2000):
        db.execute("INSERT INTO t VALUES (?)", ("y" * 500,))
    # Auto-checkpoint at the bound, and the file truncated back to it afterwards.
    assert wal.stat().st_size <= 64 * 1024 + 2 * 4096 + 32 * 1024
    truncate_wal(db)
    assert wal.stat().st_size == 0
    db.close()


def _count(url: str, table: object) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]
    finally:
        engine.dispose()


def test_relay_purges_delivered_rows_within_the_bound(cluster: Cluster) -> None:
    fast = {"purge_after_s": 1.0, "housekeeping_s": 1.0}
    a, b = cluster.up("A", "B", A=fast, B=fast)
    b.listen("worker")
    a.wait_sees("worker", "B")
    sender = a.client("boss")
    out = stream(sender, "worker@B", 30, "purged")
    assert set(out.values()) == {"delivered"}
    assert _count(cluster.store_url, deliveries) >= 30
    wait_for(
        lambda: (
            _count(cluster.store_url, deliveries) == 0 and _count(cluster.store_url, messages) == 0
        ),
        20,
        "delivered rows to be purged",
    )


def test_doorbell_that_cannot_be_rung_loses_nothing_and_stops_no_relay(
    sqlite_store: str,
) -> None:
    path = Path(sqlite_store.removeprefix("sqlite:///"))
    with Cluster(sqlite_store) as cluster:
        a, b = cluster.up("A", "B")
        worker = b.listen("worker")
        a.wait_sees("worker", "B")
        sender = a.client("boss")
        bells = doorbell_dir(path)
        subprocess.run(["chattr", "+i", str(bells)], check=True)
        try:
            out = stream(sender, "worker@B", 10, "no bell", concurrency=2)
        finally:
            subprocess.run(["chattr", "-i", str(bells)], check=True)
        # Committed rows are told as what they are (no false `unknown`), and they arrive.
        assert set(out.values()) <= set(ACKED), out
        held = settle(b, "worker", set(out), None)
        assert all(held[m] == 1 for m in out)
        assert a.relay is not None and a.relay.poll() is None
        assert b.relay is not None and b.relay.poll() is None
        assert "doorbell for host" in a.relay_log() + b.relay_log()
        worker.stop()
