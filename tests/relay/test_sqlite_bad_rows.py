"""A stray writer of the SQLite file puts rows straight into it with the sqlite3 module: bytes
that are not UTF-8, text that is not JSON. Each such row is refused once, alone; the good rows
queued behind it arrive at once (docs/storage.md, "Delivery states")."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy.engine import make_url

from crossintercom.models import Message, new_id
from crossintercom.tools.chaos.rogue import delivery_reasons, rogue_message
from tests.relay.conftest import Cluster, wait_for


def _insert(db: Path, rows: list[tuple[str, bytes | str, str]], session: str) -> None:
    """(message id, raw payload, digest) rows, each with a queued delivery, in one transaction;
    bytes go in as they are (what a writer with the file open can do)."""
    now = datetime.now(UTC)
    conn = sqlite3.connect(db, timeout=30)
    try:
        with conn:
            for mid, payload, digest in rows:
                conn.execute(
                    "INSERT INTO messages (message_id, sender_host, digest, payload, size, "
                    "created) VALUES (?, 'R', ?, CAST(? AS TEXT), 1, ?)",
                    (mid, digest, payload, now.isoformat(" ")),
                )
                conn.execute(
                    "INSERT INTO deliveries (message_id, recipient_host, recipient_session, "
                    "state, expires_at) VALUES (?, 'B', ?, 'queued', ?)",
                    (mid, session, (now + timedelta(days=1)).isoformat(" ")),
                )
    finally:
        conn.close()


def test_bad_bytes_row_refused_once_and_rows_behind_it_flow(
    sqlite_cluster: Cluster, sqlite_store: str
) -> None:
    a, b, worker = sqlite_cluster.worker_on_b()
    target = b.session_id("worker")
    db = Path(str(make_url(sqlite_store).database))

    bad_utf8, not_json, wrong_shape = new_id(), new_id(), new_id()
    good = [new_id() for _ in range(3)]
    rows: list[tuple[str, bytes | str, str]] = [
        (bad_utf8, b'{"type": "message", "message": "\xff\xfe\xc3("}', "0" * 64),
        (not_json, b"\x00not json at all", "0" * 64),
        (wrong_shape, "[1, 2, 3]", "0" * 64),
    ]
    for mid in good:
        payload = rogue_message(new_id(), "R", mid=mid, message=f"good {mid}")
        digest = Message.from_dict(payload).digest()
        rows.append((mid, json.dumps(payload), digest))
    _insert(db, rows, target)

    started = time.monotonic()
    wait_for(lambda: set(good) <= set(worker.message_ids()), 20, "the good rows to arrive")
    assert time.monotonic() - started < 15

    bad = [bad_utf8, not_json, wrong_shape]

    def refused() -> bool:
        return all(s == "refused" for s, _ in delivery_reasons(sqlite_store, bad).values())

    wait_for(refused, 20, "the bad rows to be refused")
    assert {mid: r for mid, (_, r) in delivery_reasons(sqlite_store, bad).items()} == dict.fromkeys(
        bad, "bad_message"
    )
    assert not set(bad) & set(worker.message_ids())
    # refused exactly once each, with the reason logged; the relay lives on
    log = b.relay_log()
    for mid in bad:
        assert len(re.findall(rf"inbound row {mid} from R refused", log)) == 1, log[-3000:]
    assert "not valid UTF-8" in log
    assert b.relay is not None and b.relay.poll() is None
    after = a.client("planner").send("worker@B", "after the bad rows")
    assert after.outcome.value == "delivered"
