"""The broker's durable state: known sessions, the offline queue and pending-reply entries.

A private SQLite file (``broker.sqlite``) in the runtime dir, never on a shared filesystem. WAL
with ``synchronous=NORMAL`` by default: a committed row survives a crash of the broker process,
which is the failure model the delivery contract is written for; no fsync per message. The
``durability`` setting ``full`` asks for ``FULL`` (survives a power cut; docs/operations.md).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossintercom.config import synchronous_pragma
from crossintercom.local_broker.state import schema
from crossintercom.runtime import WAL_MAX_BYTES, bound_wal, truncate_wal
from crossintercom.runtime_sqlite import connect_claimed

# Replied entries and sent asks are kept this long, so a second reply is told `already_replied`
# and a late reply still finds its asker.
_REPLY_MEMORY_S = 14 * 86400.0


@dataclass(frozen=True, slots=True)
class QueuedItem:
    seq: int
    recipient: str
    kind: str
    item_id: str
    body: dict[str, Any]
    # The body's stored size in bytes (its JSON): what handing it over writes, near enough.
    size: int = 0


def _queued(row: Sequence[Any]) -> QueuedItem:
    """A ``queue`` row read as (seq, recipient, kind, item_id, body)."""
    seq, recipient, kind, item_id, body = row
    return QueuedItem(seq, recipient, kind, item_id, json.loads(body), len(body))


@dataclass(frozen=True, slots=True)
class PendingEntry:
    ask_id: str
    replier: str
    asker_id: str
    asker_host: str
    body: dict[str, Any]
    state: str


@dataclass(frozen=True, slots=True)
class KnownSession:
    name: str | None
    groups: list[str]
    wake: str


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What ``forget_session`` removed: queued items and asks still waiting for a reply."""

    queued: list[QueuedItem]
    open_asks: list[PendingEntry]


class BrokerState:
    FILE = "broker.sqlite"

    def __init__(
        self,
        home: Path,
        file_mode: int = 0o600,
        *,
        synchronous: str = "NORMAL",
        wal_max_bytes: int = WAL_MAX_BYTES,
    ) -> None:
        path = home / self.FILE
        gid = home.stat().st_gid if file_mode & 0o060 else None
        self._db, _ = connect_claimed(
            path, file_mode, gid, ("-wal", "-shm"), isolation_level=None, timeout=30.0
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(synchronous_pragma(synchronous))
        bound_wal(self._db, wal_max_bytes)
        try:
            schema.upgrade(self._db, path)
        except BaseException:
            self._db.close()
            raise

    @property
    def db(self) -> sqlite3.Connection:
        """The file's connection, for the rooms that keep tables of their own in it (``acks``,
        ``deadletters``, ``inbound_policy``; every table is ``schema``'s); autocommit, one
        statement per change."""
        return self._db

    def checkpoint(self) -> None:
        """Empty the WAL (the broker's periodic sweep; docs/operations.md)."""
        truncate_wal(self._db)

    def close(self) -> None:
        self._db.close()

    # --- known durable sessions --------------------------------------------------------------

    def remember_session(
        self, session_id: str, name: str | None, groups: list[str], wake: str = "every"
    ) -> None:
        self._db.execute(
            "INSERT INTO known_sessions (id, name, groups, updated, wake) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET name = excluded.name, groups = excluded.groups, "
            "updated = excluded.updated, wake = excluded.wake",
            (session_id, name, json.dumps(groups), time.time(), wake),
        )

    def known_sessions(self) -> dict[str, KnownSession]:
        rows = self._db.execute("SELECT id, name, groups, wake FROM known_sessions").fetchall()
        return {r[0]: KnownSession(r[1], json.loads(r[2]), r[3] or "every") for r in rows}

    def forget_session(self, session_id: str) -> Forgotten:
        """Drop a known session with everything kept for it, in one transaction: its queued
        items (returned, so senders can be told) and the asks it was to answer."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute(
                "SELECT seq, recipient, kind, item_id, body FROM queue WHERE recipient = ? "
                "ORDER BY seq",
                (session_id,),
            ).fetchall()
            asks = self._db.execute(
                "SELECT ask_id, replier, asker_id, asker_host, body, state FROM pending_replies "
                "WHERE replier = ? AND state = 'open' ORDER BY created, rowid",
                (session_id,),
            ).fetchall()
            self._db.execute("DELETE FROM queue WHERE recipient = ?", (session_id,))
            self._db.execute("DELETE FROM pending_replies WHERE replier = ?", (session_id,))
            self._db.execute("DELETE FROM asks_sent WHERE asker_id = ?", (session_id,))
            self._db.execute("DELETE FROM known_sessions WHERE id = ?", (session_id,))
        return Forgotten(
            [_queued(r) for r in rows],
            [PendingEntry(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in asks],
        )

    # --- offline queue -------------------------------------------------------------------------

    def enqueue(
        self, recipient: str, kind: str, item_id: str, body: dict[str, Any], retention_s: float
    ) -> None:
        self.enqueue_many([(recipient, kind, item_id, body)], retention_s)

    def enqueue_many(
        self, items: Sequence[tuple[str, str, str, dict[str, Any]]], retention_s: float
    ) -> None:
        """(recipient, kind, item id, body) items queued in one transaction."""
        now = time.time()
        rows = [(r, k, i, json.dumps(b), now, now + retention_s) for r, k, i, b in items]
        self._write_all(
            "INSERT OR IGNORE INTO queue (recipient, kind, item_id, body, enqueued, expires) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )

    def _write_all(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        if len(rows) == 1:  # autocommit: one statement, one transaction
            self._db.execute(sql, rows[0])
        elif rows:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(sql, rows)

    def backlog(self, recipient: str) -> list[QueuedItem]:
        rows = self._db.execute(
            "SELECT seq, recipient, kind, item_id, body FROM queue WHERE recipient = ? "
            "ORDER BY seq",
            (recipient,),
        ).fetchall()
        return [_queued(r) for r in rows]

    def dequeue(self, seq: int) -> None:
        self._db.execute("DELETE FROM queue WHERE seq = ?", (seq,))

    def dequeue_items(self, items: Sequence[tuple[str, str, str]]) -> None:
        """(recipient, kind, item id) items dequeued in one transaction."""
        self._write_all(
            "DELETE FROM queue WHERE recipient = ? AND kind = ? AND item_id = ?", list(items)
        )

    def queue_size(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM queue").fetchone()[0])

    def take_expired(self, now: float | None = None) -> list[QueuedItem]:
        """Remove and return queued items past their retention."""
        now = time.time() if now is None else now
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute(
                "SELECT seq, recipient, kind, item_id, body FROM queue WHERE expires <= ?",
                (now,),
            ).fetchall()
            self._db.execute("DELETE FROM queue WHERE expires <= ?", (now,))
        return [_queued(r) for r in rows]

    # --- reply authorisation -------------------------------------------------------------------

    def add_pending(
        self, ask_id: str, replier: str, asker_id: str, asker_host: str, body: dict[str, Any]
    ) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO pending_replies "
            "(ask_id, replier, asker_id, asker_host, body, created, state) "
            "VALUES (?, ?, ?, ?, ?, ?, 'open')",
            (ask_id, replier, asker_id, asker_host, json.dumps(body), time.time()),
        )

    def drop_pending(self, ask_id: str, replier: str) -> None:
        self._db.execute(
            "DELETE FROM pending_replies WHERE ask_id = ? AND replier = ? AND state = 'open'",
            (ask_id, replier),
        )

    def open_pending(self, replier: str) -> list[PendingEntry]:
        rows = self._db.execute(
            "SELECT ask_id, replier, asker_id, asker_host, body, state FROM pending_replies "
            "WHERE replier = ? AND state = 'open' ORDER BY created, rowid",
            (replier,),
        ).fetchall()
        return [PendingEntry(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows]

    def consume_pending(
        self, replier: str, reply_to: str | None
    ) -> tuple[str, PendingEntry | None]:
        """Take the entry a reply answers: ('ok', entry), ('none', None) or ('already', entry)."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if reply_to is None:
                row = self._db.execute(
                    "SELECT ask_id, replier, asker_id, asker_host, body, state "
                    "FROM pending_replies WHERE replier = ? AND state = 'open' "
                    "ORDER BY created, rowid LIMIT 1",
                    (replier,),
                ).fetchone()
            else:
                row = self._db.execute(
                    "SELECT ask_id, replier, asker_id, asker_host, body, state "
                    "FROM pending_replies WHERE replier = ? AND ask_id = ?",
                    (replier, reply_to),
                ).fetchone()
            if row is None:
                return "none", None
            entry = PendingEntry(row[0], row[1], row[2], row[3], json.loads(row[4]), row[5])
            if entry.state != "open":
                return "already", entry
            self._db.execute(
                "UPDATE pending_replies SET state = 'replied' WHERE ask_id = ? AND replier = ?",
                (entry.ask_id, replier),
            )
        return "ok", entry

    def reopen_pending(self, ask_id: str, replier: str) -> None:
        self._db.execute(
            "UPDATE pending_replies SET state = 'open' WHERE ask_id = ? AND replier = ?",
            (ask_id, replier),
        )

    def open_ask_from(self, replier: str, asker_id: str, since: float) -> str | None:
        """The id of an ask ``asker_id`` made of ``replier`` after ``since`` that is still
        unanswered: the asker is (or may still be) blocked on ``replier``."""
        row = self._db.execute(
            "SELECT ask_id FROM pending_replies WHERE replier = ? AND asker_id = ? "
            "AND state = 'open' AND created >= ? ORDER BY created LIMIT 1",
            (replier, asker_id, since),
        ).fetchone()
        return None if row is None else str(row[0])

    def record_ask(self, ask_id: str, asker_id: str, recipient_id: str | None = None) -> None:
        now = time.time()
        self._db.execute(
            "INSERT OR IGNORE INTO asks_sent (ask_id, asker_id, created) VALUES (?, ?, ?)",
            (ask_id, asker_id, now),
        )
        if recipient_id is not None:
            self._db.execute(
                "INSERT OR IGNORE INTO ask_recipients (ask_id, recipient_id, created) "
                "VALUES (?, ?, ?)",
                (ask_id, recipient_id, now),
            )

    def may_answer(self, ask_id: str, replier_id: str) -> bool:
        """Whether ``replier_id`` is the session the ask went to (True for an ask recorded
        before recipients were kept)."""
        row = self._db.execute(
            "SELECT recipient_id FROM ask_recipients WHERE ask_id = ?", (ask_id,)
        ).fetchone()
        return row is None or row[0] == replier_id

    def answer_ask(self, ask_id: str, reply_id: str) -> bool:
        """Record ``reply_id`` as the answer to the ask: False when another reply answered it
        (the same reply handed over again is still its answer)."""
        self._db.execute(
            "INSERT OR IGNORE INTO asks_answered (ask_id, reply_id, created) VALUES (?, ?, ?)",
            (ask_id, reply_id, time.time()),
        )
        row = self._db.execute(
            "SELECT reply_id FROM asks_answered WHERE ask_id = ?", (ask_id,)
        ).fetchone()
        return row is not None and row[0] == reply_id

    def answered(self, ask_id: str) -> bool:
        row = self._db.execute("SELECT 1 FROM asks_answered WHERE ask_id = ?", (ask_id,))
        return row.fetchone() is not None

    def unanswer_ask(self, ask_id: str, reply_id: str) -> None:
        """A reply that reached nobody answers nothing: the ask is open again."""
        self._db.execute(
            "DELETE FROM asks_answered WHERE ask_id = ? AND reply_id = ?", (ask_id, reply_id)
        )

    def ask_owner(self, ask_id: str) -> str | None:
        row = self._db.execute(
            "SELECT asker_id FROM asks_sent WHERE ask_id = ?", (ask_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    # --- frames for a relay that is not connected ----------------------------------------------

    def outbox_put(self, frame: str, retention_s: float) -> None:
        self._db.execute(
            "INSERT INTO relay_outbox (frame, expires) VALUES (?, ?)",
            (frame, time.time() + retention_s),
        )

    def outbox_take(self) -> list[str]:
        """Every frame kept for the relay, oldest first, removed as it is returned."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute("SELECT frame FROM relay_outbox ORDER BY seq").fetchall()
            self._db.execute("DELETE FROM relay_outbox")
        return [str(r[0]) for r in rows]

    def forget_old(self, now: float | None = None) -> None:
        self._db.execute(
            "DELETE FROM relay_outbox WHERE expires <= ?", (time.time() if now is None else now,)
        )
        cutoff = (time.time() if now is None else now) - _REPLY_MEMORY_S
        self._db.execute("DELETE FROM asks_sent WHERE created < ?", (cutoff,))
        self._db.execute("DELETE FROM ask_recipients WHERE created < ?", (cutoff,))
        self._db.execute("DELETE FROM asks_answered WHERE created < ?", (cutoff,))
        self._db.execute(
            "DELETE FROM pending_replies WHERE state = 'replied' AND created < ?", (cutoff,)
        )
