"""How a session's inbox file is opened: its schema, its file mode, its journal.

The file's contents are read and written by ``Inbox`` (inbox.py); this module only makes a
connection to it ready, for writing by its owner or for reading by anyone.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import tenacity

from crossintercom.config import synchronous_pragma
from crossintercom.errors import RuntimeDirError
from crossintercom.runtime import claim_sqlite, refuse_planted, set_mode

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    kind TEXT NOT NULL,            -- 'message' or 'receipt'
    body TEXT NOT NULL,            -- the JSON object as printed by --json
    received_at REAL NOT NULL,
    shown INTEGER NOT NULL DEFAULT 0,
    UNIQUE (kind, id)
);
CREATE INDEX IF NOT EXISTS entries_unshown ON entries (shown, seq);
"""


def tighten(path: Path, file_mode: int) -> None:
    """Give an inbox file the runtime file mode; a looser one is tightened and logged (never
    through a symlink, never another user's file)."""
    was = set_mode(path, file_mode, only_tighten=True)
    if was is not None:
        log.warning("inbox file mode tightened", extra={"path": str(path), "was": oct(was)})


def open_read_only(path: Path) -> sqlite3.Connection:
    """A connection that can only read ``path``; an inbox not written yet reads as empty."""
    if path.exists() and _not_planted(path):
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30.0)
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'entries'").fetchone():
            return db
        db.close()  # created by its owner, who has not written the schema yet
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    db.execute("PRAGMA query_only = ON")
    return db


def _not_planted(path: Path) -> bool:
    """A reader opens another's inbox only if it is a plain file of the inbox dir's group
    (SQLite would follow a symlink a member planted); anything else reads as empty."""
    st = path.parent.stat()
    try:
        refuse_planted(path, st.st_gid if st.st_mode & 0o070 else None)
    except RuntimeDirError as exc:
        log.warning("inbox file refused", extra={"path": str(path), "why": str(exc)})
        return False
    return True


def busy(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.OperationalError)
        and code is not None
        and code & 0xFF == sqlite3.SQLITE_BUSY
    )


# Switching a file's journal mode takes an exclusive lock without waiting on the busy handler,
# so two connections opening one fresh inbox at once (a listener's display and its client) can
# see "database is locked" here: retry briefly instead of failing the first save.
@tenacity.retry(
    retry=tenacity.retry_if_exception(busy),
    wait=tenacity.wait_random(0.005, 0.05),
    stop=tenacity.stop_after_delay(5),
    reraise=True,
)
def _prepare(db: sqlite3.Connection, synchronous: str) -> None:
    # A rollback journal, not WAL: WAL maps its -shm index into memory, and a write to that
    # mapping once the file is made immutable (or its disk is full) kills the process with
    # SIGBUS; a journal write fails with an error the client turns into a refused ack
    # (docs/reliability.md). At the default durability synchronous=OFF: a commit still
    # survives a process crash (the failure model), with no fsync per message; durability
    # `full` syncs each commit, so it survives a power cut too (docs/operations.md).
    if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "truncate":
        db.execute("PRAGMA journal_mode=TRUNCATE")
    if synchronous == "NORMAL":
        db.execute("PRAGMA synchronous=OFF")
    else:
        db.execute(synchronous_pragma(synchronous))
    db.executescript(SCHEMA)


def open_writable(path: Path, file_mode: int, synchronous: str) -> sqlite3.Connection:
    """The owner's connection: the file created with ``file_mode`` (or a looser mode
    tightened), in rollback-journal mode at the given durability, with the schema."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created (or checked) before SQLite opens it, with the journal it will use: SQLite follows
    # a symlink a member of a group runtime dir planted (docs/operations.md).
    gid = path.parent.stat().st_gid if file_mode & 0o060 else None
    fresh = claim_sqlite(path, file_mode, gid, ("-journal",))
    db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    try:
        if not fresh:
            tighten(path, file_mode)
        _prepare(db, synchronous)
        tighten(path.with_name(path.name + "-journal"), file_mode)
    except BaseException:
        db.close()
        raise
    return db
