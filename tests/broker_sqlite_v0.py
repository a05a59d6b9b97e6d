"""A ``broker.sqlite`` as every release before its schema had a version wrote it (version 0,
local_broker/state/schema.py): the fixture its upgrade is tested from, and how a test reads a file's
rows and shape.

The statements are a copy of the old ones on purpose, not of ``schema.STEPS``: they record what
files in the field hold, so the upgrade is tested against that and not against itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

# The statements every release before the version wrote, as they ran (BrokerState, AckBook,
# DeadLetterBook, InboundPolicy, each its own script): the fixture of a version 0 file. The
# oldest files lack ``known_sessions.wake`` (added by ALTER TABLE when opened).
V0_SCRIPTS = (
    """
CREATE TABLE IF NOT EXISTS known_sessions (
    id TEXT PRIMARY KEY,
    name TEXT,
    groups TEXT NOT NULL,
    updated REAL NOT NULL,
    wake TEXT                       -- the wake policy; NULL is 'every'
);
CREATE TABLE IF NOT EXISTS queue (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient TEXT NOT NULL,
    kind TEXT NOT NULL,             -- 'message' or 'receipt'
    item_id TEXT NOT NULL,
    body TEXT NOT NULL,
    enqueued REAL NOT NULL,
    expires REAL NOT NULL,
    UNIQUE (recipient, kind, item_id)
);
CREATE INDEX IF NOT EXISTS queue_by_recipient ON queue (recipient, seq);
CREATE INDEX IF NOT EXISTS queue_by_expiry ON queue (expires);
CREATE TABLE IF NOT EXISTS pending_replies (
    ask_id TEXT NOT NULL,
    replier TEXT NOT NULL,
    asker_id TEXT NOT NULL,
    asker_host TEXT NOT NULL,
    body TEXT NOT NULL,
    created REAL NOT NULL,
    state TEXT NOT NULL,            -- 'open' or 'replied'
    PRIMARY KEY (ask_id, replier)
);
CREATE INDEX IF NOT EXISTS pending_open ON pending_replies (replier, state, created);
CREATE TABLE IF NOT EXISTS relay_outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    frame TEXT NOT NULL,            -- a broker -> relay frame, as JSON
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS asks_sent (
    ask_id TEXT PRIMARY KEY,
    asker_id TEXT NOT NULL,
    created REAL NOT NULL
);
-- Who an ask went to: only that session may answer it (a forged reply_to answers nothing).
CREATE TABLE IF NOT EXISTS ask_recipients (
    ask_id TEXT PRIMARY KEY,
    recipient_id TEXT NOT NULL,
    created REAL NOT NULL
);
-- The reply that answered an ask of a session of this host: a second one is already_replied,
-- from another host as from this one (the replier's host may not be the one that tells).
CREATE TABLE IF NOT EXISTS asks_answered (
    ask_id TEXT PRIMARY KEY,
    reply_id TEXT NOT NULL,
    created REAL NOT NULL
);
""",
    """
CREATE TABLE IF NOT EXISTS ack_waits (
    message_id TEXT PRIMARY KEY,
    sender TEXT NOT NULL,           -- the sending session of this host
    recipient TEXT NOT NULL,        -- the target as the sender wrote it
    sent REAL NOT NULL,
    ack_by TEXT,                    -- ISO deadline, or NULL for none
    acked REAL,
    acked_by TEXT,
    note TEXT
);
CREATE INDEX IF NOT EXISTS ack_waits_by_sender ON ack_waits (sender, sent);
""",
    """
CREATE TABLE IF NOT EXISTS sent_queued (
    message_id TEXT PRIMARY KEY,
    sender TEXT NOT NULL,
    body TEXT NOT NULL,             -- the OutgoingBody as sent, JSON
    sent REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    message_id TEXT NOT NULL,
    recipient TEXT NOT NULL,        -- a session id, or the target as written
    sender TEXT NOT NULL,
    body TEXT NOT NULL,
    outcome TEXT NOT NULL,
    code TEXT,
    reason TEXT,
    at REAL NOT NULL,
    resent_as TEXT,
    PRIMARY KEY (message_id, recipient)
);
CREATE INDEX IF NOT EXISTS dead_letters_by_sender ON dead_letters (sender, at);
""",
    """
CREATE TABLE IF NOT EXISTS inbound_rules (
    session TEXT NOT NULL,
    pattern TEXT NOT NULL,
    action TEXT NOT NULL,
    PRIMARY KEY (session, pattern)
);
CREATE TABLE IF NOT EXISTS held_mail (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    message_id TEXT NOT NULL,
    body TEXT NOT NULL,
    held REAL NOT NULL,
    UNIQUE (session, message_id)
);
""",
)
TABLES = (
    "known_sessions",
    "queue",
    "pending_replies",
    "relay_outbox",
    "asks_sent",
    "ask_recipients",
    "asks_answered",
    "ack_waits",
    "sent_queued",
    "dead_letters",
    "inbound_rules",
    "held_mail",
)


def write_version_0(path: Path, rows: dict[str, list[tuple[Any, ...]]], *, wake: bool) -> None:
    """A broker.sqlite as the releases before the version wrote it, holding ``rows``."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    wake_column = ",\n    wake TEXT                       -- the wake policy; NULL is 'every'"
    for script in V0_SCRIPTS:
        db.executescript(script if wake else script.replace(wake_column, ""))
    for table, table_rows in rows.items():
        for row in table_rows:
            kept = row if wake or table != "known_sessions" else row[:-1]
            db.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(kept))})", kept)
    db.close()


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    db = sqlite3.connect(path)
    try:
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in TABLES}
    finally:
        db.close()


def columns(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Each table's and index's shape, as SQLite reports it (not the CREATE text)."""
    db = sqlite3.connect(path)
    try:
        names = db.execute(
            "SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
            "ORDER BY type, name"
        ).fetchall()
        return {
            f"{kind} {name}": db.execute(
                f"PRAGMA {'table_xinfo' if kind == 'table' else 'index_xinfo'}({name})"
            ).fetchall()
            for kind, name, _ in names
        }
    finally:
        db.close()


def version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()
