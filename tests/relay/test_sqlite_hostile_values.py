"""A writer of the SQLite file stores values of another type than the column's (SQLite keeps
any value in any column): a BLOB or text that is not UTF-8 as a message's sender or digest,
a roster row whose groups are not JSON, a heartbeat time that is not a time. Each such row is
refused or left out alone; no relay crashes, and mail behind it and between the other hosts
flows (docs/operations.md, "Trust model")."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from sqlalchemy.engine import make_url

from crossintercom.models import Message, new_id
from crossintercom.storage.wakeup import ROSTER, ring_doorbell
from crossintercom.tools.chaos.rogue import delivery_reasons, rogue_message
from tests.relay.conftest import Cluster, wait_for
from tests.relay.rogue import Rogue

# What the writer stores instead of the message's sender or digest.
HOSTILE = {
    "digest_blob": "UPDATE messages SET digest = CAST(digest AS BLOB) WHERE message_id = ?",
    "digest_not_utf8": "UPDATE messages SET digest = CAST(X'52FF' AS TEXT) WHERE message_id = ?",
    "sender_blob": (
        "UPDATE messages SET sender_host = CAST(sender_host AS BLOB) WHERE message_id = ?"
    ),
    "sender_not_utf8": (
        "UPDATE messages SET sender_host = CAST(X'52FF' AS TEXT) WHERE message_id = ?"
    ),
}


def _write(db: Path, statements: list[tuple[str, tuple[str, ...]]]) -> None:
    conn = sqlite3.connect(db, timeout=30)
    try:
        with conn:
            for sql, params in statements:
                conn.execute(sql, params)
    finally:
        conn.close()


def test_rows_with_values_of_another_type_are_refused_alone(
    sqlite_cluster: Cluster, sqlite_store: str
) -> None:
    a, b = sqlite_cluster.up("A", "B")
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    target = b.session_id("worker")
    db = Path(str(make_url(sqlite_store).database))
    rogue = Rogue(sqlite_store)
    try:
        bad = {kind: new_id() for kind in HOSTILE}
        good = [new_id() for _ in range(3)]
        rows = [(mid, rogue_message(new_id(), "R", mid=mid)) for mid in bad.values()]
        rows += [(mid, rogue_message(new_id(), "R", mid=mid, message="good")) for mid in good]
        rogue.insert(rows, sender_host="R", recipient_host="B", recipient_session=target)
    finally:
        rogue.close()
    for mid, payload in rows:
        assert Message.from_dict(json.loads(json.dumps(payload))).id == mid
    _write(db, [(HOSTILE[kind], (mid,)) for kind, mid in bad.items()])
    ring_doorbell(db, "B")

    # A BLOB holding the same UTF-8 bytes is the same value: delivered. Text that is not
    # UTF-8 is refused, alone.
    blobs = [bad["digest_blob"], bad["sender_blob"]]
    wait_for(lambda: set(good + blobs) <= set(worker.message_ids()), 20, "the good rows to arrive")
    refused = [bad["digest_not_utf8"], bad["sender_not_utf8"]]

    def reasons() -> dict[str, tuple[str, str | None]]:
        return delivery_reasons(sqlite_store, refused)

    wait_for(
        lambda: reasons() == dict.fromkeys(refused, ("refused", "bad_message")),
        20,
        lambda: f"the rows that are not UTF-8 to be refused: {reasons()}",
    )
    assert not set(refused) & set(worker.message_ids())
    assert b.relay is not None and b.relay.poll() is None, b.relay_log()[-2000:]
    planner = a.client("planner")
    assert planner.send("worker@B", "after").outcome.value == "delivered"


def test_roster_and_host_rows_of_another_type_crash_no_relay(
    sqlite_cluster: Cluster, sqlite_store: str
) -> None:
    a, b = sqlite_cluster.up("A", "B", A={"remote_ack_wait_s": 10})
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    db = Path(str(make_url(sqlite_store).database))
    roster_row = (
        "INSERT INTO roster (host_id, session_id, purpose, groups, durable, online) "
        "VALUES ('R', ?, 'agent', ?, 1, 1)"
    )
    _write(
        db,
        [
            (
                "INSERT INTO hosts (host_id, generation, heartbeat, roster_rev) "
                "VALUES ('R', 1, 1, 1)",
                (),
            ),
            (roster_row, (new_id(), "not json")),
            (roster_row, (new_id(), "5")),
            ("UPDATE hosts SET beat_at = 'not a time' WHERE host_id = 'R'", ()),
            ("UPDATE hosts SET roster_rev = roster_rev + 1", ()),
        ],
    )
    ring_doorbell(db, "", ROSTER)
    # a session that appears after the hostile rows is still seen
    b.listen("later")
    a.wait_sees("later", "B")
    planner = a.client("planner")
    assert planner.send("worker@B", "after the hostile rows").outcome.value == "delivered"
    wait_for(lambda: len(worker.message_ids()) == 1, 20, "the mail to arrive")
    for host in (a, b):
        assert host.relay is not None and host.relay.poll() is None, host.relay_log()[-2000:]
        assert "roster rows left out" in host.relay_log()
    hosts = a.cli_json("status", "--json")
    assert hosts
