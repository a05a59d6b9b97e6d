"""The per-host dedup authority (DESIGN §5).

The broker lodges an operation id before it forwards a message and marks it accepted, with the
outcome it is about to report, once the write is confirmed. A retry of the same id then gets the
retained outcome instead of a second delivery. Only a keyed HMAC-SHA256 of the canonical payload is
stored, never message text; the key (``delivered-messages.key``) never leaves the host.

Storage is a private SQLite file in the runtime dir, in WAL mode with ``synchronous=NORMAL`` by
default: every commit reaches the OS before the call returns, so it survives the process being
killed (the failure model here), not necessarily a power cut; ``synchronous="FULL"`` (the
``durability`` setting ``full``) adds an fsync per commit for that. The connection holds an
exclusive lock for its lifetime, so a second broker on the same runtime dir fails to open instead
of sharing the file unnoticed.

Time: record deadlines live on the injected monotonic ``clock``, so wall-clock jumps cannot move
them inside a process. The wall-clock expiry is persisted as well, so records outlive a restart. On
open the remaining lifetime is ``clamp(expires_wall - wall(), 0, ttl_s)``: a wall clock that jumped
backwards cannot keep a record longer than ``ttl_s`` after the open, one that jumped forwards can at
worst expire records early. The clamped expiry is written back, so repeated restarts cannot extend
a record either. The monotonic clock must not go backwards.

Threading: not thread-safe. The broker calls it from its single asyncio thread; each call is one
short local transaction (no fsync on commit in WAL/NORMAL), cheap enough to run on the loop. Calls
must never overlap.

Discards are batched: ``discard`` forgets the record in memory at once (so the id behaves exactly
as unknown from then on) and its DELETE rides in the next write transaction, or in
``flush_discarded``, which the broker calls a few times a second. A record whose DELETE was lost
with a killed process comes back on open as the accepted record it was, and only suppresses a
duplicate a little longer (until its expiry); nothing that a discard promised is weakened.

The files themselves (creating, validating, loading, moving aside, and the text of every statement
on their tables) are ``files``'s; this module keeps the records in memory and decides.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from crossintercom.config import synchronous_pragma
from crossintercom.errors import Code, CrossintercomError
from crossintercom.local_broker.authority import files, records, schema
from crossintercom.local_broker.authority.records import (
    CONFLICT,
    FORWARD_AGAIN,
    NEW,
    OVER_CAPACITY,
    UNCERTAIN,
    Decision,
    DecisionKind,
    Entry,
    check_op_id,
    record_size,
)
from crossintercom.runtime import WAL_MAX_BYTES, bound_wal, truncate_wal

__all__ = ["AuthorityUnavailable", "Decision", "DecisionKind", "DedupAuthority"]


class AuthorityUnavailable(CrossintercomError):
    """The dedup authority could not record the operation (local disk error)."""

    code = Code.AUTHORITY_UNAVAILABLE


class DedupAuthority:
    """Accepted-operation records for one broker (see the module docstring)."""

    FILE = schema.DB_FILE
    KEY = schema.KEY_FILE

    def __init__(
        self,
        runtime_dir: Path,
        *,
        max_records: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
        ttl_s: float = 720.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        file_mode: int = 0o600,
        synchronous: str = "NORMAL",
        wal_max_bytes: int = WAL_MAX_BYTES,
    ) -> None:
        """Open the authority in ``runtime_dir``, creating both files if both are absent.

        ``file_mode`` is the mode for new files and the loosest mode accepted on the key file:
        0o600 per user, 0o660 for a group-wide deployment (DESIGN §7).
        Raises ``AuthorityError`` if the files are unusable; never recreates them silently.
        """
        if max_records < 1 or max_bytes < 1 or not ttl_s > 0:
            raise ValueError("max_records, max_bytes and ttl_s must be positive")
        if file_mode & ~0o660:
            raise ValueError("file_mode may grant read/write to owner and group only")
        self._dir = Path(runtime_dir)
        self._db_path = self._dir / self.FILE
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._ttl = float(ttl_s)
        self._clock = clock
        self._wall = wall
        # Ordered by deadline: new records get now + ttl from a monotonic clock, so appending
        # keeps the order and sweep only looks at the front.
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._bytes = 0
        self._conn: sqlite3.Connection | None = None
        # Discarded ids whose DELETE has not been written yet (see the module docstring).
        self._discarded: list[str] = []

        self._key, conn, records = files.open_files(
            self._dir, mode=file_mode, ttl=self._ttl, wall=wall, clock=clock
        )
        for r in records:
            entry = Entry(r.deadline, r.digest, r.accepted, record_size(r.op_id, r.outcome))
            self._entries[r.op_id] = entry
            self._bytes += entry.size
        try:
            conn.execute(synchronous_pragma(synchronous))
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        bound_wal(conn, wal_max_bytes)

    # -- public API ------------------------------------------------------------------------

    @staticmethod
    def reset(runtime_dir: Path) -> list[Path]:
        """Move the authority files (and SQLite's -wal/-shm) aside; return their new paths.

        The database and its sidecars keep SQLite's naming, so the moved copy opens as a whole.
        Only call this while no broker has the authority open.
        """
        return files.reset(runtime_dir)

    def lodge(self, op_id: str, payload: bytes, *, remote: bool = False) -> Decision:
        """Lodge ``op_id`` before forwarding; durable before it returns ``new``.

        Known id with a different payload: ``conflict``. Accepted with the same payload:
        ``retained``. Only lodged: ``uncertain`` for a local target (the first attempt may have
        been delivered), ``forward_again`` for a remote one (the shared store answers by id).
        Unknown id past a bound (after dropping expired records): ``over_capacity``.
        """
        [decision], _ = self.commit([(op_id, payload, remote)], [])
        if isinstance(decision, AuthorityUnavailable):
            raise decision
        return decision

    def accept(self, op_id: str, outcome: dict[str, Any]) -> None:
        """Mark a lodged id accepted, retaining ``outcome`` (ids, outcome, codes, receipts).

        Accepting an accepted id replaces its outcome. Never refused for capacity: the message
        already went out, so accounted bytes may briefly exceed ``max_bytes`` (new ids are
        refused meanwhile). Raises ``KeyError`` for an id that holds no record.
        """
        self.accept_many([(op_id, outcome)])

    def accept_many(self, items: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """``accept`` for several ids in one transaction; validates all before writing any."""
        self._require_open()
        updates = {op_id: self.encode_outcome(op_id, outcome) for op_id, outcome in items}
        _, error = self.commit([], list(updates.items()))
        if error is not None:
            raise error

    check_op_id = staticmethod(check_op_id)

    def encode_outcome(self, op_id: str, outcome: dict[str, Any]) -> str:
        """The text ``accept`` retains for ``op_id``; raises as ``accept`` does."""
        if op_id not in self._entries:
            raise KeyError(op_id)
        return records.encode_outcome(outcome)

    def commit(
        self, lodges: Sequence[tuple[str, bytes, bool]], accepts: Sequence[tuple[str, str]]
    ) -> tuple[list[Decision | AuthorityUnavailable], AuthorityUnavailable | None]:
        """Ids to lodge (id, payload, remote) and acceptances (id, encoded outcome, of lodged
        ids) in one transaction: a group commit. Returns each lodged id's decision, in order (as
        ``lodge`` would have made them one after another), and the error that failed the write,
        if one did: every write then failed and nothing changed, so each lodging that needed one
        is that error, and so is the acceptances' outcome."""
        self._require_open()
        for op_id, _, _ in lodges:
            check_op_id(op_id)
        now = self._clock()
        self._expire(now)
        staged: dict[str, Entry] = {}
        staged_bytes = 0
        decisions: list[Decision | None] = []
        rows: list[tuple[Any, ...]] = []
        for op_id, payload, remote in lodges:
            digest = hmac.new(self._key, payload, hashlib.sha256).hexdigest()
            entry = self._entries.get(op_id) or staged.get(op_id)
            if entry is not None:
                decisions.append(self._known(op_id, entry, digest, remote))
                continue
            size = record_size(op_id, None)
            total = len(self._entries) + len(staged)
            if total >= self._max_records or self._bytes + staged_bytes + size > self._max_bytes:
                decisions.append(OVER_CAPACITY)
                continue
            staged[op_id] = Entry(now + self._ttl, digest, False, size)
            staged_bytes += size
            rows.append((op_id, digest, schema.LODGED, self._wall() + self._ttl))
            decisions.append(None)  # new, once the write succeeded
        writes = [(schema.INSERT_LODGED, rows)] if rows else []
        if accepts:
            writes.append((schema.SET_ACCEPTED, [(schema.ACCEPTED, t, i) for i, t in accepts]))
        try:
            self._write_all(writes)
        except AuthorityUnavailable as exc:
            return [exc if d is None else d for d in decisions], exc
        self._entries.update(staged)
        self._bytes += staged_bytes
        for op_id, text in accepts:
            entry = self._entries.get(op_id)
            if entry is None:  # discarded meanwhile: its DELETE went first, the UPDATE found none
                continue
            size = record_size(op_id, text)
            self._bytes += size - entry.size
            entry.size = size
            entry.accepted = True
        return [NEW if d is None else d for d in decisions], None

    def _known(self, op_id: str, entry: Entry, digest: str, remote: bool) -> Decision:
        if not hmac.compare_digest(entry.digest, digest):
            return CONFLICT
        if entry.accepted:
            return Decision(DecisionKind.RETAINED, self._stored_outcome(op_id))
        return FORWARD_AGAIN if remote else UNCERTAIN

    def abandon(self, op_id: str) -> None:
        """Drop a lodged id whose message was not sent at all, so a retry may go through.

        Unknown ids are ignored. Raises ``ValueError`` for an accepted id: forgetting it would let
        a retry deliver twice.
        """
        self._require_open()
        entry = self._entries.get(op_id)
        if entry is None:
            return
        if entry.accepted:
            raise ValueError(f"operation {op_id!r} was accepted; it cannot be abandoned")
        self._drop([op_id])

    def discard(self, op_id: str) -> None:
        """Forget ``op_id``: the sending client confirmed it has the outcome. Idempotent."""
        self.discard_many((op_id,))

    def discard_many(self, op_ids: Sequence[str]) -> None:
        """``discard`` for several ids in one transaction."""
        self._require_open()
        for op_id in dict.fromkeys(op_ids):
            entry = self._entries.pop(op_id, None)
            if entry is not None:
                self._bytes -= entry.size
                self._discarded.append(op_id)

    def flush_discarded(self) -> None:
        """Write the DELETEs of discarded records that no other write has carried yet."""
        self._require_open()
        if self._discarded:
            self._write(schema.DELETE_OP, [])

    def sweep(self) -> int:
        """Drop records past their deadline; return how many."""
        self._require_open()
        return self._expire(self._clock())

    def checkpoint(self) -> None:
        """Empty the WAL now (the broker's sweep): between sweeps it is bounded by
        ``wal_max_bytes``, and on a small disk that much space held by the host's own file is
        what saving mail needs once the disk has room again (docs/operations.md)."""
        conn = self._require_open()
        try:
            truncate_wal(conn)
        except sqlite3.Error as e:
            raise AuthorityUnavailable(f"checkpointing {self._db_path} failed: {e}") from e

    def stats(self) -> tuple[int, int]:
        """(live records, accounted bytes); expired records count until the next sweep."""
        return len(self._entries), self._bytes

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(AuthorityUnavailable):
                self.flush_discarded()  # else they come back on the next open until they expire
            conn, self._conn = self._conn, None
            conn.close()

    def __enter__(self) -> DedupAuthority:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _require_open(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the dedup authority is closed")
        return self._conn

    def _stored_outcome(self, op_id: str) -> dict[str, Any]:
        conn = self._require_open()
        try:
            row = conn.execute(schema.SELECT_OUTCOME, (op_id,)).fetchone()
        except sqlite3.Error as e:
            raise AuthorityUnavailable(f"reading {self._db_path} failed: {e}") from e
        if row is None or not isinstance(row[0], str):
            raise schema.corrupt(self._db_path, f"record {op_id!r} vanished or lost its outcome")
        outcome = json.loads(row[0])
        if not isinstance(outcome, dict):
            raise schema.corrupt(self._db_path, f"record {op_id!r} has a non-object outcome")
        return outcome

    def _write(self, sql: str, params: list[tuple[Any, ...]]) -> None:
        self._write_all([(sql, params)])

    def _write_all(self, writes: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        """Run each statement once per parameter tuple, all as a single transaction, after the
        DELETEs of discarded records (so a discarded id lodged again is deleted before it is
        inserted).

        Callers update the in-memory mirror only after this returns, so a failed write leaves
        memory and file in agreement; discarded ids stay pending until a write succeeds.
        """
        conn = self._require_open()
        discarded = self._discarded
        if discarded:
            writes = [(schema.DELETE_OP, [(op_id,) for op_id in discarded]), *writes]
        writes = [(sql, params) for sql, params in writes if params]
        try:
            if len(writes) == 1 and len(writes[0][1]) == 1:
                conn.execute(writes[0][0], writes[0][1][0])  # autocommit: one statement
            elif writes:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for sql, params in writes:
                        conn.executemany(sql, params)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise AuthorityUnavailable(f"writing {self._db_path} failed: {e}") from e
        self._discarded = []

    def _drop(self, op_ids: list[str]) -> None:
        self._write(schema.DELETE_OP, [(op_id,) for op_id in op_ids])
        for op_id in op_ids:
            self._bytes -= self._entries.pop(op_id).size

    def _due(self, now: float) -> Iterator[str]:
        for op_id, entry in self._entries.items():
            if entry.deadline > now:
                return
            yield op_id

    def _expire(self, now: float) -> int:
        # Peek first: the common case (nothing due) must cost no write.
        first = next(iter(self._entries.values()), None)
        if first is None or first.deadline > now:
            return 0
        due = list(self._due(now))
        self._drop(due)
        return len(due)
