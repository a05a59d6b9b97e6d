"""A session's durable inbox: the client saves each message here before acknowledging it.

One SQLite file per session id under ``$CROSSINTERCOM_HOME/inbox/``. The message id is the key,
so a message handed over twice (after a crash, a retry or a relay restart) is held once. The
``shown`` mark is set only after the message was printed and flushed (docs/delivery.md). The file
is bounded: past ``max_entries``, the oldest entries already shown are pruned (docs/operations.md).

This module (with inbox_file.py, which opens the file) is the only one that knows where an inbox
file lives and what it holds: every reader (the CLI, the tools, the tests) goes through ``Inbox``;
``Inbox.view`` reads another process's inbox without creating or changing anything.

A full disk or a read-only inbox makes an operation raise ``InboxUnavailable`` (and records the
fault in ``faults``, inbox_faults.py) instead of SQLite's error; messages a surface showed but
could not mark are held as shown in this process and marked once the file can be written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from crossintercom.config import Settings
from crossintercom.errors import InboxUnavailable
from crossintercom.inbox_faults import FAULTS, READ, WRITE, InboxFaults, guarded
from crossintercom.inbox_file import open_read_only, open_writable
from crossintercom.models import (
    Message,
    Receipt,
)
from crossintercom.runtime import modes

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    id: str
    kind: str
    body: dict[str, Any]
    shown: bool


_COLUMNS = "seq, id, kind, body, shown"
_INSERT = (
    "INSERT OR IGNORE INTO entries (id, kind, body, received_at, shown) VALUES (?, ?, ?, ?, ?)"
)
_MARK_SHOWN = "UPDATE entries SET shown = 1 WHERE seq = ?"
_encode = msgspec.json.Encoder().encode


def _row(item: Message | Receipt, shown: bool, now: float) -> tuple[str, str, str, float, int]:
    if isinstance(item, Message):
        # The message's JSON as ``to_dict`` gives it, encoded in one step.
        return item.id, "message", _encode(item).decode(), now, int(shown)
    body = json.dumps({"type": "receipt", **item.to_dict()})
    return item.key, "receipt", body, now, int(shown)


# Entries kept by default (docs/operations.md, setting ``inbox_max_entries``); entries never
# shown are kept whatever the bound, since pruning them would lose mail.
DEFAULT_MAX_ENTRIES = 10_000
# Pruning runs at open and then once per this many saves: a bounded cost per save.
_PRUNE_EVERY = 100


class Inbox:
    """Not shared between threads; each process or thread opens its own."""

    def __init__(
        self,
        directory: Path,
        session_id: str,
        file_mode: int = 0o600,
        *,
        read_only: bool = False,
        synchronous: str = "NORMAL",
        max_entries: int = DEFAULT_MAX_ENTRIES,
        faults: InboxFaults | None = None,
    ) -> None:
        self.path = directory / f"{session_id}.sqlite"
        self.max_entries = max_entries
        self.faults = faults or InboxFaults()
        self._saves = 0
        # Entries shown by this process whose mark could not be written yet (see mark_shown).
        self._unmarked: set[int] = set()
        if read_only:
            # A journal its owner has not rolled back yet (a writer killed mid-commit) cannot be
            # read without writing: a fault like any other, gone once the owner opens it.
            try:
                self._db = open_read_only(self.path)
            except FAULTS as exc:
                raise self.faults.failed(READ, exc) from exc
            return
        try:
            self._db = open_writable(self.path, file_mode, synchronous)
        except FAULTS as exc:
            raise self.faults.failed(READ, exc) from exc
        with contextlib.suppress(InboxUnavailable):  # pruning waits for a writable file
            self.prune()

    @classmethod
    def of(cls, settings: Settings, session_id: str, faults: InboxFaults | None = None) -> Inbox:
        """The session's own inbox on this host: the host's file mode, durability and bound."""
        return cls(
            settings.inbox_dir,
            session_id,
            modes(settings)[1],
            synchronous=settings.sqlite_synchronous,
            max_entries=settings.inbox_max_entries,
            faults=faults,
        )

    @classmethod
    def view(cls, directory: Path, session_id: str) -> Inbox:
        """Read a session's inbox (another process may own it) without creating or writing it."""
        return cls(directory, session_id, read_only=True)

    @classmethod
    def remove(cls, directory: Path, session_id: str) -> bool:
        """Delete a session's inbox file (``forget``); True if there was one."""
        path = directory / f"{session_id}.sqlite"
        existed = path.exists()
        for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            p.unlink(missing_ok=True)
        return existed

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Inbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing (the session's own client) ---------------------------------------------------

    def save(self, message: Message, *, shown: bool = False) -> bool:
        """Store once; True if it was new. Committed before the caller acknowledges."""
        return self.save_many([(message, shown)])[0]

    @guarded(WRITE)
    def save_many(self, items: Sequence[tuple[Message | Receipt, bool]]) -> list[bool]:
        """``save`` (or ``save_receipt``) for several entries, each with its ``shown`` mark, in
        one transaction: all are committed or none (the error is raised). Whether each was new,
        in order."""
        now = time.time()
        rows = [_row(item, shown, now) for item, shown in items]
        db = self._db
        if len(rows) == 1:  # autocommit: one statement, one transaction
            new = [db.execute(_INSERT, rows[0]).rowcount == 1]
        else:
            with self._transaction():
                new = [db.execute(_INSERT, row).rowcount == 1 for row in rows]
        self._saved(len(rows))
        return new

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _saved(self, n: int = 1) -> None:
        before, self._saves = self._saves, self._saves + n
        if before // _PRUNE_EVERY != self._saves // _PRUNE_EVERY:
            with contextlib.suppress(InboxUnavailable):  # saved all the same; pruned later
                self.prune()

    @guarded(WRITE)
    def prune(self) -> int:
        """Delete the oldest shown entries past ``max_entries``; returns how many went.

        A message handed over again after its entry was pruned would be shown again; hand-overs
        repeat within minutes (a crash, a retry), long before an entry is this old.
        """
        cur = self._db.execute(
            "DELETE FROM entries WHERE shown = 1 AND seq <= ("
            " SELECT seq FROM entries ORDER BY seq DESC LIMIT 1 OFFSET ?)",
            (self.max_entries,),
        )
        return cur.rowcount

    def save_receipt(self, receipt: Receipt) -> bool:
        return self.save_many([(receipt, False)])[0]

    def holds_other_payload(self, message: Message) -> bool:
        """True if ``message.id`` is held for a different payload (sender, text, thread...)."""
        held = self.message(message.id)
        if held is None:
            return False
        return Message.from_dict(held.body).canonical_payload() != message.canonical_payload()

    def mark_shown(self, seqs: list[int]) -> bool:
        """Mark entries shown, in one transaction; False if the file cannot be written now.

        Never raises for that: the caller has shown them already. They are held as shown in
        this process (``unshown`` leaves them out) and marked with the next mark that works.
        """
        todo = sorted(self._unmarked.union(seqs))
        if not todo:
            return True
        try:
            self._mark(todo)
        except InboxUnavailable:
            self._unmarked.update(seqs)
            return False
        self._unmarked.clear()
        return True

    def recheck(self) -> InboxUnavailable | None:
        """Try again what failed (a read; the marks held back, or a write that changes nothing
        one can see); the error if the inbox still fails, None if it works (docs/reliability.md)."""
        with contextlib.suppress(InboxUnavailable):
            if READ in self.faults.current:
                self.count()
            if self._unmarked:
                self.mark_shown([])
            elif WRITE in self.faults.current:
                self._probe()
        return self.faults.error()

    @guarded(WRITE)
    def _probe(self) -> None:
        # Rewrites the header page (journal and all): a real write, so it fails as a save would.
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        self._db.execute(f"PRAGMA user_version = {int(version)}")

    @guarded(WRITE)
    def _mark(self, seqs: list[int]) -> None:
        if len(seqs) == 1:
            self._db.execute(_MARK_SHOWN, (seqs[0],))
            return
        with self._transaction():
            self._db.executemany(_MARK_SHOWN, [(s,) for s in seqs])

    @guarded(WRITE)
    def mark_message_shown(self, message_id: str) -> None:
        self._db.execute(
            "UPDATE entries SET shown = 1 WHERE kind = 'message' AND id = ?", (message_id,)
        )

    @guarded(WRITE)
    def add_flag(self, message_id: str, flag: str) -> None:
        held = self.message(message_id)
        if held is None:
            return
        body = held.body
        if flag not in body["flags"]:
            body["flags"].append(flag)
            self._db.execute(
                "UPDATE entries SET body = ? WHERE kind = 'message' AND id = ?",
                (json.dumps(body), message_id),
            )

    # --- reading ------------------------------------------------------------------------------

    @guarded(READ)
    def _select(self, where: str = "", params: tuple[Any, ...] = ()) -> list[Entry]:
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM entries {where} ORDER BY seq", params
        ).fetchall()
        return [Entry(r[0], r[1], r[2], json.loads(r[3]), bool(r[4])) for r in rows]

    def transcript(self) -> list[Entry]:
        """Every message and receipt, in arrival order."""
        return self._select()

    def messages(self) -> list[Entry]:
        return self._select("WHERE kind = 'message'")

    def messages_after(self, seq: int) -> list[Entry]:
        """Messages that arrived after entry ``seq`` (a reader following the inbox)."""
        return self._select("WHERE kind = 'message' AND seq > ?", (seq,))

    def receipts(self) -> list[Entry]:
        return self._select("WHERE kind = 'receipt'")

    def unshown(self) -> list[Entry]:
        """Entries never shown, oldest first (those shown here but not marked yet left out)."""
        if self._unmarked or self.faults.current:
            self.recheck()
        return [e for e in self._select("WHERE shown = 0") if e.seq not in self._unmarked]

    def message(self, message_id: str) -> Entry | None:
        found = self._select("WHERE kind = 'message' AND id = ?", (message_id,))
        return found[0] if found else None

    @guarded(READ)
    def has(self, message_id: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM entries WHERE kind = 'message' AND id = ?", (message_id,)
        ).fetchone()
        return row is not None

    @guarded(READ)
    def received_at(self, message_ids: list[str]) -> dict[str, float]:
        """When each held message of ``message_ids`` was saved (wall clock), by id."""
        out: dict[str, float] = {}
        for start in range(0, len(message_ids), 500):  # SQLite's bound-parameter limit
            chunk = message_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(
                f"SELECT id, received_at FROM entries WHERE kind = 'message' AND id IN ({marks})",
                chunk,
            )
            out.update((r[0], float(r[1])) for r in rows)
        return out

    @guarded(READ)
    def count(self) -> int:
        """How many messages are held (receipts not counted)."""
        row = self._db.execute("SELECT count(*) FROM entries WHERE kind = 'message'").fetchone()
        return int(row[0])

    @guarded(READ)
    def count_after(self, seq: int) -> tuple[int, int]:
        """How many messages were saved after entry ``seq``, and the last entry's seq (``seq``
        itself when none was): a running count that reads only what is new (``seq`` is
        AUTOINCREMENT, so it only grows)."""
        row = self._db.execute(
            "SELECT count(*) FILTER (WHERE kind = 'message'), max(seq) FROM entries WHERE seq > ?",
            (seq,),
        ).fetchone()
        return int(row[0]), seq if row[1] is None else int(row[1])


def session_ids(directory: Path) -> list[str]:
    """The sessions that have an inbox on this host."""
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.glob("*.sqlite"))


def trouble(open_box: Callable[[], Inbox]) -> InboxUnavailable | None:
    """Why a session's inbox fails now, after trying again what failed; None if it works."""
    try:
        return open_box().recheck()
    except InboxUnavailable as exc:  # it cannot even be opened
        return exc
