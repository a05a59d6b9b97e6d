"""A session's durable inbox: the client saves each message here before acknowledging it.

One SQLite file per session id under ``$CROSSINTERCOM_HOME/inbox/``. The message id is the key,
so a message handed over twice (after a crash, a retry or a relay restart) is held once. The
``shown`` mark is set only after the message was printed and flushed (docs/delivery.md).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossintercom.models import Message, Receipt

log = logging.getLogger(__name__)

_SCHEMA = """
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


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    id: str
    kind: str
    body: dict[str, Any]
    shown: bool


def _tighten(path: Path, file_mode: int) -> None:
    """Give an inbox file the runtime file mode; a looser one is tightened and logged (§7)."""
    try:
        current = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return
    if current & ~file_mode:
        path.chmod(file_mode)
        log.warning("inbox file mode tightened", extra={"path": str(path), "was": oct(current)})


class Inbox:
    """Not shared between threads; each process or thread opens its own."""

    def __init__(self, directory: Path, session_id: str, file_mode: int = 0o600) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{session_id}.sqlite"
        fresh = not self.path.exists()
        self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        if fresh:
            self.path.chmod(file_mode)
        else:
            _tighten(self.path, file_mode)
        # WAL + NORMAL: a commit survives a process crash (the failure model) with no fsync each.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        for suffix in ("-wal", "-shm"):  # SQLite gives them the mode the database file had
            _tighten(self.path.with_name(self.path.name + suffix), file_mode)

    def close(self) -> None:
        self._db.close()

    def save(self, message: Message, *, shown: bool = False) -> bool:
        """Store once; True if it was new. Committed before the caller acknowledges."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO entries (id, kind, body, received_at, shown) "
            "VALUES (?, 'message', ?, ?, ?)",
            (message.id, json.dumps(message.to_dict()), time.time(), int(shown)),
        )
        return cur.rowcount == 1

    def save_receipt(self, receipt: Receipt) -> bool:
        cur = self._db.execute(
            "INSERT OR IGNORE INTO entries (id, kind, body, received_at, shown) "
            "VALUES (?, 'receipt', ?, ?, 0)",
            (receipt.key, json.dumps({"type": "receipt", **receipt.to_dict()}), time.time()),
        )
        return cur.rowcount == 1

    def holds_other_payload(self, message: Message) -> bool:
        """True if ``message.id`` is held for a different payload (sender, text, thread...)."""
        row = self._db.execute(
            "SELECT body FROM entries WHERE kind = 'message' AND id = ?", (message.id,)
        ).fetchone()
        if row is None:
            return False
        held = Message.from_dict(json.loads(row[0]))
        return held.canonical_payload() != message.canonical_payload()

    def has(self, message_id: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM entries WHERE kind = 'message' AND id = ?", (message_id,)
        ).fetchone()
        return row is not None

    def unshown(self) -> list[Entry]:
        rows = self._db.execute(
            "SELECT seq, id, kind, body, shown FROM entries WHERE shown = 0 ORDER BY seq"
        ).fetchall()
        return [Entry(r[0], r[1], r[2], json.loads(r[3]), bool(r[4])) for r in rows]

    def mark_shown(self, seqs: list[int]) -> None:
        if seqs:
            self._db.executemany("UPDATE entries SET shown = 1 WHERE seq = ?", [(s,) for s in seqs])

    def mark_message_shown(self, message_id: str) -> None:
        self._db.execute(
            "UPDATE entries SET shown = 1 WHERE kind = 'message' AND id = ?", (message_id,)
        )

    def add_flag(self, message_id: str, flag: str) -> None:
        row = self._db.execute(
            "SELECT body FROM entries WHERE kind = 'message' AND id = ?", (message_id,)
        ).fetchone()
        if row is None:
            return
        body = json.loads(row[0])
        if flag not in body["flags"]:
            body["flags"].append(flag)
            self._db.execute(
                "UPDATE entries SET body = ? WHERE kind = 'message' AND id = ?",
                (json.dumps(body), message_id),
            )

    def transcript(self) -> list[Entry]:
        rows = self._db.execute(
            "SELECT seq, id, kind, body, shown FROM entries ORDER BY seq"
        ).fetchall()
        return [Entry(r[0], r[1], r[2], json.loads(r[3]), bool(r[4])) for r in rows]
