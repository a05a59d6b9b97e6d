"""A writer of the SQLite file stores values of another type than the column's (SQLite keeps
any value in any column): a BLOB or text that is not UTF-8 as a message's sender or digest,
a roster row whose groups are not JSON, a heartbeat time that is not a time, a message id or
session that is not UTF-8, a huge sender, receipts and settings of another type. Each such row
is refused or left out alone (a broken schema is named, with a code); no relay crashes, and
mail behind it and between the other hosts flows (docs/operations.md, "Trust model")."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from crossintercom.models import Message, new_id
from crossintercom.storage.wakeup import RECEIPTS, ROSTER, ring_doorbell
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


def _queue(
    rogue: Rogue, bad: Iterable[str], target: str
) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    """The hostile rows' messages (to be spoiled next), then three good ones behind them,
    queued for ``target`` on B by host R."""
    good = [new_id() for _ in range(3)]
    rows = [(mid, rogue_message(new_id(), "R", mid=mid)) for mid in bad]
    rows += [(mid, rogue_message(new_id(), "R", mid=mid, message="good")) for mid in good]
    rogue.insert(rows, sender_host="R", recipient_host="B", recipient_session=target)
    return good, rows


def test_rows_with_values_of_another_type_are_refused_alone(
    sqlite_cluster: Cluster, sqlite_store: str
) -> None:
    a, b, worker = sqlite_cluster.worker_on_b()
    target = b.session_id("worker")
    db = Path(str(make_url(sqlite_store).database))
    rogue = Rogue(sqlite_store)
    try:
        bad = {kind: new_id() for kind in HOSTILE}
        good, rows = _queue(rogue, bad.values(), target)
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
    a, b, worker = sqlite_cluster.worker_on_b(A={"remote_ack_wait_s": 10})
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


# A message id, recipient session or sender a writer stored as no relay would: the delivery row
# is read as bytes, refused alone and finished by its seq; housekeeping expires and purges past
# it. A suffix byte keeps each id unique.
NOT_UTF8 = "CAST(CAST({c} AS BLOB) || X'FF' AS TEXT)"
KEYS = {
    "id_not_utf8": [
        f"UPDATE messages SET message_id = {NOT_UTF8.format(c='message_id')} WHERE message_id = ?",
        f"UPDATE deliveries SET message_id = {NOT_UTF8.format(c='message_id')} "
        "WHERE message_id = ?",
    ],
    "id_blob": [
        "UPDATE messages SET message_id = CAST(message_id AS BLOB) WHERE message_id = ?",
        "UPDATE deliveries SET message_id = CAST(message_id AS BLOB) WHERE message_id = ?",
    ],
    "huge_sender": [
        "UPDATE messages SET sender_host = printf('%.*c', 5000000, 'R') WHERE message_id = ?"
    ],
    # Expired and not UTF-8 in both keys: every expiry (of every host's rows) failed on it.
    "expired_not_utf8": [
        f"UPDATE deliveries SET recipient_session = {NOT_UTF8.format(c='recipient_session')}, "
        f"message_id = {NOT_UTF8.format(c='message_id')}, expires_at = '2000-01-01 00:00:00' "
        "WHERE message_id = ?"
    ],
}


def _states(db: Path) -> dict[int, tuple[str, str | None]]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        rows = conn.execute("SELECT seq, state, reason FROM deliveries ORDER BY seq").fetchall()
    finally:
        conn.close()
    return {seq: (state, reason) for seq, state, reason in rows}


def test_delivery_keys_of_another_type_are_refused_alone_by_seq(
    sqlite_cluster: Cluster, sqlite_store: str
) -> None:
    a, b, worker = sqlite_cluster.worker_on_b(B={"housekeeping_s": 1})
    target = b.session_id("worker")
    db = Path(str(make_url(sqlite_store).database))
    rogue = Rogue(sqlite_store)
    try:
        bad = {kind: new_id() for kind in KEYS}
        good, rows = _queue(rogue, bad.values(), target)
        # A well-formed row that expired, for a session nobody holds: housekeeping's.
        expiring = new_id()
        rogue.insert(
            [(expiring, rogue_message(new_id(), "R", mid=expiring))],
            sender_host="R",
            recipient_host="B",
            recipient_session=new_id(),
        )
    finally:
        rogue.close()
    seq = {mid: i for i, (mid, _) in enumerate([*rows, (expiring, None)], start=1)}
    _write(db, [(sql, (bad[kind],)) for kind, stmts in KEYS.items() for sql in stmts])
    _write(
        db,
        [
            (
                "UPDATE deliveries SET expires_at = '2000-01-01 00:00:00' WHERE message_id = ?",
                (expiring,),
            )
        ],
    )
    ring_doorbell(db, "B")

    # The BLOB holding a UTF-8 id is that id: delivered, and finished (not handed over again).
    wait_for(
        lambda: {*good, bad["id_blob"]} <= set(worker.message_ids()),
        20,
        "the good rows to arrive",
    )
    want = {
        seq[bad["id_not_utf8"]]: ("refused", "bad_message"),
        seq[bad["id_blob"]]: ("delivered", None),
        seq[bad["huge_sender"]]: ("refused", "bad_message"),
        seq[bad["expired_not_utf8"]]: ("expired", "expired"),
        seq[expiring]: ("expired", "expired"),
    }

    def states() -> dict[int, tuple[str, str | None]]:
        return {k: v for k, v in _states(db).items() if k in want}

    wait_for(lambda: states() == want, 20, lambda: f"the rows to be finished: {states()}")
    log = b.relay_log()
    assert "message id or recipient session is not valid UTF-8" in log
    assert max(map(len, log.splitlines())) < 10_000  # the huge sender is not logged
    assert b.relay is not None and b.relay.poll() is None, log[-2000:]
    planner = a.client("planner")
    assert planner.send("worker@B", "after").outcome.value == "delivered"


def test_receipts_and_settings_of_another_type_block_no_send(
    sqlite_cluster: Cluster, sqlite_store: str
) -> None:
    a, _, _ = sqlite_cluster.worker_on_b(A={"remote_ack_wait_s": 10})
    db = Path(str(make_url(sqlite_store).database))
    receipt = (
        "INSERT INTO receipts (sender_host, message_id, recipient_session, recipient_host, "
        "outcome, code, created, sender_session, note) "
        "VALUES ('A', {}, 's', 'B', {}, {}, '2026-01-01 00:00:00', 'x', {})"
    )
    nb = "CAST(X'52FF' AS TEXT)"
    _write(
        db,
        [
            (receipt.format(nb, "'refused'", "NULL", "NULL"), ()),
            (receipt.format("'m'", nb, "NULL", "NULL"), ()),
            (receipt.format("'m'", "'refused'", nb, "NULL"), ()),
            (receipt.format("'m'", "'acknowledged'", "NULL", nb), ()),
            (f"UPDATE settings SET max_message_bytes = {nb}, retention_s = 'a week'", ()),
        ],
    )
    ring_doorbell(db, "A", RECEIPTS)
    planner = a.client("planner")
    assert planner.send("worker@B", "after").outcome.value == "delivered"
    log = a.relay_log()
    assert "receipts for host A dropped: a value is not UTF-8" in log
    assert "store settings max_message_bytes, retention_s are not whole numbers" in log
    wait_for(lambda: not _rows(db, "SELECT id FROM receipts"), 20, "the bad receipts to go")


def test_a_schema_a_writer_broke_is_named_with_a_code(
    sqlite_cluster: Cluster, sqlite_store: str
) -> None:
    a, b, _ = sqlite_cluster.worker_on_b()
    db = Path(str(make_url(sqlite_store).database))
    _write(
        db,
        [
            ("ALTER TABLE deliveries RENAME TO kept", ()),
            ("CREATE VIEW deliveries AS SELECT * FROM kept", ()),
        ],
    )
    planner = a.client("planner")
    answer = planner.send("worker@B", "into a view")
    assert (answer.outcome.value, answer.code) == ("not_sent", "store_error"), answer
    # the sender (perhaps a model) is told without the store's file name; the log says how
    assert "store is damaged" in (answer.message or "") and str(db) not in str(answer.message)
    assert "renamed, dropped or replaced a table or column" in a.relay_log()
    # a file cut short is named the same way
    with db.open("r+b") as f:
        f.truncate(db.stat().st_size // 2)
    answer = planner.send("worker@B", "into a torn file")
    assert (answer.outcome.value, answer.code) == ("not_sent", "store_error"), answer
    assert "store is damaged" in (answer.message or ""), answer
    for host in (a, b):
        assert host.relay is not None and host.relay.poll() is None, host.relay_log()[-2000:]


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()
