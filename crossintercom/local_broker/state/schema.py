"""``broker.sqlite``'s schema, whole, with its version (docs/operations.md, "Files in the
runtime dir").

The file's ``PRAGMA user_version`` says how many of ``STEPS`` it holds; opening it applies the
missing ones in order, in one transaction, and refuses a file of a later version than this code
knows (a newer crossintercom wrote it) with ``schema_too_new``, changing nothing. Step 1 is the
schema as every file written before the version existed holds it (version 0): its statements
create only what is missing, and it adds the ``wake`` column older files lack. A later step is
an ordinary change, appended to ``STEPS``, and runs once per file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from crossintercom.errors import BrokerStateTooNew

_STEP_1 = (
    # Sessions that survive a broker restart (the registry's durable ones).
    """CREATE TABLE IF NOT EXISTS known_sessions (
    id TEXT PRIMARY KEY,
    name TEXT,
    groups TEXT NOT NULL,
    updated REAL NOT NULL,
    wake TEXT                       -- the wake policy; NULL is 'every'
)""",
    # The offline queue: mail and receipts for a session that is away.
    """CREATE TABLE IF NOT EXISTS queue (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    recipient TEXT NOT NULL,
    kind TEXT NOT NULL,             -- 'message' or 'receipt'
    item_id TEXT NOT NULL,
    body TEXT NOT NULL,
    enqueued REAL NOT NULL,
    expires REAL NOT NULL,
    UNIQUE (recipient, kind, item_id)
)""",
    "CREATE INDEX IF NOT EXISTS queue_by_recipient ON queue (recipient, seq)",
    "CREATE INDEX IF NOT EXISTS queue_by_expiry ON queue (expires)",
    """CREATE TABLE IF NOT EXISTS pending_replies (
    ask_id TEXT NOT NULL,
    replier TEXT NOT NULL,
    asker_id TEXT NOT NULL,
    asker_host TEXT NOT NULL,
    body TEXT NOT NULL,
    created REAL NOT NULL,
    state TEXT NOT NULL,            -- 'open' or 'replied'
    PRIMARY KEY (ask_id, replier)
)""",
    "CREATE INDEX IF NOT EXISTS pending_open ON pending_replies (replier, state, created)",
    """CREATE TABLE IF NOT EXISTS relay_outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    frame TEXT NOT NULL,            -- a broker -> relay frame, as JSON
    expires REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS asks_sent (
    ask_id TEXT PRIMARY KEY,
    asker_id TEXT NOT NULL,
    created REAL NOT NULL
)""",
    # Who an ask went to: only that session may answer it (a forged reply_to answers nothing).
    """CREATE TABLE IF NOT EXISTS ask_recipients (
    ask_id TEXT PRIMARY KEY,
    recipient_id TEXT NOT NULL,
    created REAL NOT NULL
)""",
    # The reply that answered an ask of a session of this host: a second one is
    # already_replied, from another host as from this one (the replier's host may not be the
    # one that tells).
    """CREATE TABLE IF NOT EXISTS asks_answered (
    ask_id TEXT PRIMARY KEY,
    reply_id TEXT NOT NULL,
    created REAL NOT NULL
)""",
    # Messages sent with an acknowledgement request (acks.py).
    """CREATE TABLE IF NOT EXISTS ack_waits (
    message_id TEXT PRIMARY KEY,
    sender TEXT NOT NULL,           -- the sending session of this host
    recipient TEXT NOT NULL,        -- the target as the sender wrote it
    sent REAL NOT NULL,
    ack_by TEXT,                    -- ISO deadline, or NULL for none
    acked REAL,
    acked_by TEXT,
    note TEXT
)""",
    "CREATE INDEX IF NOT EXISTS ack_waits_by_sender ON ack_waits (sender, sent)",
    # Sends that were queued, kept while they may still fail; and dead letters (deadletters.py).
    """CREATE TABLE IF NOT EXISTS sent_queued (
    message_id TEXT PRIMARY KEY,
    sender TEXT NOT NULL,
    body TEXT NOT NULL,             -- the OutgoingBody as sent, JSON
    sent REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS dead_letters (
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
)""",
    "CREATE INDEX IF NOT EXISTS dead_letters_by_sender ON dead_letters (sender, at)",
    # Inbound rules by sender and the mail they hold (inbound_policy.py).
    """CREATE TABLE IF NOT EXISTS inbound_rules (
    session TEXT NOT NULL,
    pattern TEXT NOT NULL,
    action TEXT NOT NULL,
    PRIMARY KEY (session, pattern)
)""",
    """CREATE TABLE IF NOT EXISTS held_mail (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    message_id TEXT NOT NULL,
    body TEXT NOT NULL,
    held REAL NOT NULL,
    UNIQUE (session, message_id)
)""",
)


def _step_1(db: sqlite3.Connection) -> None:
    """The schema of version 0 files, which hold all of it, part of it (a file of an older
    release, or one only ``BrokerState`` opened) or none (a new file)."""
    for statement in _STEP_1:
        db.execute(statement)
    columns = {r[1] for r in db.execute("PRAGMA table_info(known_sessions)")}
    if "wake" not in columns:  # a file written before wake policies existed
        db.execute("ALTER TABLE known_sessions ADD COLUMN wake TEXT")


Step = Callable[[sqlite3.Connection], None]
# In order; a file at version N holds the first N. Append, never edit a step that shipped.
STEPS: tuple[Step, ...] = (_step_1,)
VERSION = len(STEPS)


def version_of(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def upgrade(db: sqlite3.Connection, path: Path, steps: tuple[Step, ...] = STEPS) -> None:
    """Bring the open file (an autocommit connection) to the latest version in place, or
    refuse one newer than ``steps`` with ``BrokerStateTooNew``."""
    latest = len(steps)
    if _checked(db, path, latest) == latest:
        return  # the usual open: nothing to write
    db.execute("BEGIN IMMEDIATE")
    try:
        # Read again under the write lock: another process may have upgraded it meanwhile.
        for step in steps[_checked(db, path, latest) :]:
            step(db)
        db.execute(f"PRAGMA user_version = {latest}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _checked(db: sqlite3.Connection, path: Path, latest: int) -> int:
    version = version_of(db)
    if version > latest:
        raise BrokerStateTooNew(
            f"{path} has schema version {version}, newer than this crossintercom knows "
            f"({latest}): a newer crossintercom wrote it. Run that version, or upgrade this "
            "one; moving the file aside loses the mail queued in it",
            path=str(path),
            version=version,
            known=latest,
        )
    return version
