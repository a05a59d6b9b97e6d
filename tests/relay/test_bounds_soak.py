"""A soak under small bounds: inbox entries, WAL files and finished store rows stay within the
bounds of docs/operations.md ("Bounded files") while traffic runs, and nothing is lost or
duplicated."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import create_engine, func, select

from crossintercom.storage.tables import deliveries, messages
from crossintercom.tools.harness import BULK_SENDER
from tests.relay.conftest import Cluster, wait_for
from tests.relay.faultkit import ACKED, stream_in_background

MAX_ENTRIES = 40
WAL_MAX = 64 * 1024
PURGE_AFTER = 1.0
HOUSEKEEPING = 1.0
BOUNDS = {
    **BULK_SENDER,
    "inbox_max_entries": MAX_ENTRIES,
    "wal_max_bytes": WAL_MAX,
    "purge_after_s": PURGE_AFTER,
    "housekeeping_s": HOUSEKEEPING,
}
# Pruned at open and every 100 saves, so up to 100 shown entries beyond the bound in between.
SHOWN_CEILING = MAX_ENTRIES + 100
# A checkpoint runs once the WAL passes the bound, so the file ends one transaction beyond it
# (a few pages); a concurrent reader can hold it back for a moment.
WAL_CEILING = WAL_MAX + 256 * 1024
# A finished row goes at the first housekeeping pass after purge_after_s; allow a slow pass.
ROW_AGE_CEILING = PURGE_AFTER + HOUSEKEEPING + 5.0
N = 1500


def _shown_entries(home: Path) -> int:
    """Shown entries in every inbox under ``home``, read without opening an Inbox (which prunes)."""
    total = 0
    for path in (home / "inbox").glob("*.sqlite"):
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            total = max(
                total, int(db.execute("SELECT count(*) FROM entries WHERE shown = 1").fetchone()[0])
            )
        finally:
            db.close()
    return total


WALS = {"broker.sqlite-wal", "delivered-messages.sqlite-wal"}


def _largest_wal(seen_wals: set[str], *homes: Path) -> tuple[int, str]:
    sizes = [(0, "")]
    for home in homes:
        for wal in home.glob("*.sqlite-wal"):
            seen_wals.add(wal.name)
            try:
                sizes.append((wal.stat().st_size, f"{home.name}/{wal.name}"))
            except FileNotFoundError:
                continue
    return max(sizes)


def _oldest_finished_age(url: str) -> tuple[int, float]:
    """(finished rows, age in seconds of the oldest one) in the store."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            q = select(func.count(), func.min(deliveries.c.finished_at)).where(
                deliveries.c.state != "queued"
            )
            count, oldest = conn.execute(q).one()
    finally:
        engine.dispose()
    if oldest is None:
        return int(count), 0.0
    if oldest.tzinfo is None:
        oldest = oldest.replace(tzinfo=UTC)
    return int(count), (datetime.now(UTC) - oldest).total_seconds()


def _rows(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            n = conn.execute(select(func.count()).select_from(deliveries)).scalar_one()
            m = conn.execute(select(func.count()).select_from(messages)).scalar_one()
            return int(n) + int(m)
    finally:
        engine.dispose()


def test_bounds_hold_in_a_soak(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", A=BOUNDS, B=BOUNDS)
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    sender = a.client("boss")
    started = time.monotonic()
    thread, progress, errors = stream_in_background(sender, "worker@B", N, "soak", concurrency=8)
    peak = {"shown": 0, "wal": 0, "age": 0.0, "rows": 0}
    where = ""
    seen_wals: set[str] = set()

    def sample() -> None:
        nonlocal where
        peak["shown"] = max(peak["shown"], _shown_entries(b.home))
        wal, name = _largest_wal(seen_wals, a.home, b.home)
        if wal > peak["wal"]:
            peak["wal"], where = wal, name
        rows, age = _oldest_finished_age(cluster.store_url)
        peak["rows"] = max(peak["rows"], rows)
        peak["age"] = max(peak["age"], age)
        assert peak["shown"] <= SHOWN_CEILING, peak
        assert peak["wal"] <= WAL_CEILING, (peak, where)
        assert peak["age"] <= ROW_AGE_CEILING, peak

    while thread.is_alive():
        sample()
        thread.join(0.25)
    assert not errors, errors
    elapsed = time.monotonic() - started
    assert set(progress.values()) <= set(ACKED), set(progress.values())
    acked = set(progress)
    assert len(acked) == N

    wait_for(
        lambda: acked <= set(worker.message_ids()),
        60,
        lambda: f"{len(acked - set(worker.message_ids()))} messages to be printed",
    )
    # Finished rows go after purge_after_s; the inbox is back at its bound once pruned at a save.
    wait_for(lambda: _rows(cluster.store_url) == 0, 20, "finished rows to be purged")
    sample()
    printed = worker.message_ids()
    lost = len(acked - set(printed))
    dups = sum(c - 1 for c in printed.values() if c > 1)
    print(
        f"soak: {N} messages in {elapsed:.1f}s, lost={lost} dup={dups}, "
        f"peak shown inbox entries={peak['shown']} (bound {MAX_ENTRIES}+100), "
        f"largest WAL={peak['wal']} B ({where}; bound {WAL_MAX} B), "
        f"peak finished rows={peak['rows']}, oldest={peak['age']:.1f}s (purge {PURGE_AFTER}s)"
    )
    assert seen_wals >= WALS, seen_wals  # the bound was checked on both files
    assert lost == 0 and dups == 0
    assert set(printed) == acked
    worker.stop()
