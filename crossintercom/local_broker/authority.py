"""The per-host dedup authority (DESIGN §5).

The broker reserves an operation id before it forwards a message and marks it accepted, with the
outcome it is about to report, once the write is confirmed. A retry of the same id then gets the
retained outcome instead of a second delivery. Only a keyed HMAC-SHA256 of the canonical payload is
stored, never message text; the key (``delivered-messages.key``) never leaves the host.

Storage is a private SQLite file in the runtime dir, in WAL mode with ``synchronous=NORMAL``: every
commit reaches the OS before the call returns, so it survives the process being killed (the failure
model here), not necessarily a power cut. The connection holds an exclusive lock for its lifetime,
so a second broker on the same runtime dir fails to open instead of sharing the file unnoticed.

Time: record deadlines live on the injected monotonic ``clock``, so wall-clock jumps cannot move
them inside a process. The wall-clock expiry is persisted as well, so records outlive a restart. On
open the remaining lifetime is ``clamp(expires_wall - wall(), 0, ttl_s)``: a wall clock that jumped
backwards cannot keep a record longer than ``ttl_s`` after the open, one that jumped forwards can at
worst expire records early. The clamped expiry is written back, so repeated restarts cannot extend
a record either. The monotonic clock must not go backwards.

Threading: not thread-safe. The broker calls it from its single asyncio thread; each call is one
short local transaction (no fsync on commit in WAL/NORMAL), cheap enough to run on the loop. Calls
must never overlap.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import sqlite3
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

from crossintercom.errors import AuthorityError, CrossintercomError

__all__ = ["AuthorityUnavailable", "Decision", "DecisionKind", "DedupAuthority"]

log = logging.getLogger(__name__)

KEY_SIZE = 32
HMAC_HEX_LEN = 64
# Fixed per-record cost added to id + hmac + outcome, standing in for index and row overhead.
RECORD_OVERHEAD = 64
MAX_OP_ID_LEN = 256
SCHEMA_VERSION = 1
# "CIDA": marks the file as ours, so an unrelated SQLite file is not mistaken for an authority.
APPLICATION_ID = 0x43494441
RESET_ADVICE = (
    "run `crossintercom broker --reset-authority` to move the authority files aside "
    "(retries of operations sent before the reset can then be delivered again)"
)
_KEY_CHECK_LABEL = b"crossintercom dedup authority key check v1"
_HEX_RE = re.compile(f"[0-9a-f]{{{HMAC_HEX_LEN}}}")
_RESERVED = "reserved"
_ACCEPTED = "accepted"
# Compared verbatim with sqlite_master: SQLite keeps the CREATE text as written.
_SCHEMA = (
    ("meta", "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"),
    (
        "ops",
        "CREATE TABLE ops (op_id TEXT PRIMARY KEY, hmac TEXT NOT NULL, state TEXT NOT NULL, "
        "outcome TEXT, expires_wall REAL NOT NULL) WITHOUT ROWID",
    ),
)

DecisionKind = Literal["new", "retained", "conflict", "uncertain", "forward_again", "over_capacity"]


class AuthorityUnavailable(CrossintercomError):
    """The dedup authority could not record the operation (local disk error)."""

    code = "authority_unavailable"


@dataclass(frozen=True)
class Decision:
    """What ``reserve`` found. ``outcome`` is set only for ``retained`` (a fresh copy each time)."""

    kind: DecisionKind
    outcome: dict[str, Any] | None = None


_NEW = Decision("new")
_CONFLICT = Decision("conflict")
_UNCERTAIN = Decision("uncertain")
_FORWARD_AGAIN = Decision("forward_again")
_OVER_CAPACITY = Decision("over_capacity")


class _Entry:
    """In-memory mirror of one row, so ``reserve`` needs no read round trip."""

    __slots__ = ("accepted", "deadline", "digest", "size")

    def __init__(self, deadline: float, digest: str, accepted: bool, size: int) -> None:
        self.deadline = deadline
        self.digest = digest
        self.accepted = accepted
        self.size = size


def _record_size(op_id: str, outcome_json: str | None) -> int:
    size = len(op_id.encode()) + HMAC_HEX_LEN + RECORD_OVERHEAD
    if outcome_json is not None:
        size += len(outcome_json.encode())
    return size


def _check_op_id(op_id: str) -> None:
    if not isinstance(op_id, str) or not op_id or len(op_id) > MAX_OP_ID_LEN:
        raise ValueError(f"operation id must be a non-empty string of at most {MAX_OP_ID_LEN}")


def _carries_text(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k == "text" or _carries_text(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_carries_text(v) for v in value)
    return False


def _encode_outcome(outcome: dict[str, Any]) -> str:
    if not isinstance(outcome, dict):
        raise ValueError("outcome must be a JSON object")
    # The file promises to hold no message text; a "text" key means the caller passed a message.
    if _carries_text(outcome):
        raise ValueError("outcome must not carry message text")
    try:
        return json.dumps(outcome, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"outcome is not JSON-serialisable: {e}") from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _corrupt(path: Path, why: str) -> AuthorityError:
    return AuthorityError(f"{path}: {why}; {RESET_ADVICE}", path=str(path))


class DedupAuthority:
    """Accepted-operation records for one broker (see the module docstring)."""

    FILE = "delivered-messages.sqlite"
    KEY = "delivered-messages.key"

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
        self._key_path = self._dir / self.KEY
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._ttl = float(ttl_s)
        self._clock = clock
        self._wall = wall
        self._mode = file_mode
        # Ordered by deadline: new records get now + ttl from a monotonic clock, so appending
        # keeps the order and sweep only looks at the front.
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._conn: sqlite3.Connection | None = None

        if not self._dir.is_dir():
            raise AuthorityError(f"runtime dir {self._dir} does not exist", path=str(self._dir))
        db_there = os.path.lexists(self._db_path)
        key_there = os.path.lexists(self._key_path)
        if not db_there and not key_there:
            stray = [p for p in self._sidecars(self._db_path) if os.path.lexists(p)]
            if stray:
                raise _corrupt(stray[0], f"left over without {self.FILE}")
            self._key = self._create()
        elif not db_there:
            raise _corrupt(self._db_path, f"is missing but {self.KEY} exists")
        elif not key_there:
            raise _corrupt(self._key_path, f"is missing but {self.FILE} exists")
        else:
            self._key = self._read_key()
        self._open()

    # -- public API ------------------------------------------------------------------------

    @staticmethod
    def reset(runtime_dir: Path) -> list[Path]:
        """Move the authority files (and SQLite's -wal/-shm) aside; return their new paths.

        The database and its sidecars keep SQLite's naming, so the moved copy opens as a whole.
        Only call this while no broker has the authority open.
        """
        runtime_dir = Path(runtime_dir)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        db = runtime_dir / DedupAuthority.FILE
        key = runtime_dir / DedupAuthority.KEY
        sources = [db, *DedupAuthority._sidecars(db), key]

        def targets(suffix: str) -> list[Path]:
            bad_db = runtime_dir / f"{DedupAuthority.FILE}.bad-{suffix}"
            return [
                bad_db,
                *DedupAuthority._sidecars(bad_db),
                runtime_dir / f"{DedupAuthority.KEY}.bad-{suffix}",
            ]

        suffix, n = stamp, 1
        while any(os.path.lexists(t) for t in targets(suffix)):
            n += 1
            suffix = f"{stamp}-{n}"
        moved = []
        for src, dst in zip(sources, targets(suffix), strict=True):
            if os.path.lexists(src):
                os.rename(src, dst)
                moved.append(dst)
        if moved:
            _fsync_dir(runtime_dir)
        return moved

    def reserve(self, op_id: str, payload: bytes, *, remote: bool = False) -> Decision:
        """Reserve ``op_id`` before forwarding; durable before it returns ``new``.

        Known id with a different payload: ``conflict``. Accepted with the same payload:
        ``retained``. Only reserved: ``uncertain`` for a local target (the first attempt may have
        been delivered), ``forward_again`` for a remote one (the shared store answers by id).
        Unknown id past a bound (after dropping expired records): ``over_capacity``.
        """
        self._require_open()
        _check_op_id(op_id)
        digest = hmac.new(self._key, payload, hashlib.sha256).hexdigest()
        now = self._clock()
        self._expire(now)
        entry = self._entries.get(op_id)
        if entry is not None:
            if not hmac.compare_digest(entry.digest, digest):
                return _CONFLICT
            if entry.accepted:
                return Decision("retained", self._stored_outcome(op_id))
            return _FORWARD_AGAIN if remote else _UNCERTAIN
        size = _record_size(op_id, None)
        if len(self._entries) >= self._max_records or self._bytes + size > self._max_bytes:
            return _OVER_CAPACITY
        self._write(
            "INSERT INTO ops (op_id, hmac, state, outcome, expires_wall) VALUES (?, ?, ?, NULL, ?)",
            [(op_id, digest, _RESERVED, self._wall() + self._ttl)],
        )
        self._entries[op_id] = _Entry(now + self._ttl, digest, False, size)
        self._bytes += size
        return _NEW

    def accept(self, op_id: str, outcome: dict[str, Any]) -> None:
        """Mark a reserved id accepted, retaining ``outcome`` (ids, outcome, codes, receipts).

        Accepting an accepted id replaces its outcome. Never refused for capacity: the message
        already went out, so accounted bytes may briefly exceed ``max_bytes`` (new reservations
        are refused meanwhile). Raises ``KeyError`` for an id that holds no record.
        """
        self.accept_many([(op_id, outcome)])

    def accept_many(self, items: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """``accept`` for several ids in one transaction; validates all before writing any."""
        self._require_open()
        updates: dict[str, str] = {}
        for op_id, outcome in items:
            if op_id not in self._entries:
                raise KeyError(op_id)
            updates[op_id] = _encode_outcome(outcome)
        if not updates:
            return
        self._write(
            "UPDATE ops SET state = ?, outcome = ? WHERE op_id = ?",
            [(_ACCEPTED, text, op_id) for op_id, text in updates.items()],
        )
        for op_id, text in updates.items():
            entry = self._entries[op_id]
            size = _record_size(op_id, text)
            self._bytes += size - entry.size
            entry.size = size
            entry.accepted = True

    def abandon(self, op_id: str) -> None:
        """Drop a reservation whose message was not sent at all, so a retry may go through.

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

    def release(self, op_id: str) -> None:
        """Forget ``op_id``: the sending client confirmed it has the outcome. Idempotent."""
        self.release_many((op_id,))

    def release_many(self, op_ids: Sequence[str]) -> None:
        """``release`` for several ids in one transaction."""
        self._require_open()
        known = [op_id for op_id in dict.fromkeys(op_ids) if op_id in self._entries]
        if known:
            self._drop(known)

    def sweep(self) -> int:
        """Drop records past their deadline; return how many."""
        self._require_open()
        return self._expire(self._clock())

    def stats(self) -> tuple[int, int]:
        """(live records, accounted bytes); expired records count until the next sweep."""
        return len(self._entries), self._bytes

    def close(self) -> None:
        if self._conn is not None:
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

    @staticmethod
    def _sidecars(db: Path) -> tuple[Path, Path]:
        return db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")

    def _require_open(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the dedup authority is closed")
        return self._conn

    def _key_check(self) -> str:
        return hmac.new(self._key, _KEY_CHECK_LABEL, hashlib.sha256).hexdigest()

    def _create(self) -> bytes:
        """Create key and database side by side, renaming both into place at the end.

        Only a crash between the two renames leaves one file without the other, which the next
        open reports rather than guesses about.
        """
        key = secrets.token_bytes(KEY_SIZE)
        self._key = key
        token = secrets.token_hex(6)
        tmp_key = self._dir / f".{self.KEY}.{token}.tmp"
        tmp_db = self._dir / f".{self.FILE}.{token}.tmp"
        try:
            fd = os.open(tmp_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, self._mode)
            try:
                os.fchmod(fd, self._mode)  # umask may have removed bits we want (group mode)
                os.write(fd, key)
                os.fsync(fd)
            finally:
                os.close(fd)
            fd = os.open(tmp_db, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, self._mode)
            try:
                os.fchmod(fd, self._mode)
            finally:
                os.close(fd)
            conn = sqlite3.connect(tmp_db, isolation_level=None)
            try:
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("BEGIN")
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                for _, ddl in _SCHEMA:
                    conn.execute(ddl)
                conn.execute(
                    "INSERT INTO meta (name, value) VALUES ('key_check', ?)", (self._key_check(),)
                )
                conn.execute("COMMIT")
            finally:
                conn.close()
            fd = os.open(tmp_db, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp_db, self._db_path)
            os.rename(tmp_key, self._key_path)
            _fsync_dir(self._dir)
        except BaseException:
            for p in (tmp_key, tmp_db, tmp_db.with_name(tmp_db.name + "-journal")):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            raise
        return key

    def _check_owned_regular(self, path: Path) -> os.stat_result:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise _corrupt(path, "is not a regular file")
        if st.st_uid != os.geteuid():
            raise _corrupt(path, f"is owned by uid {st.st_uid}, not by this user")
        return st

    def _read_key(self) -> bytes:
        path = self._key_path
        st = self._check_owned_regular(path)
        perms = stat.S_IMODE(st.st_mode)
        if perms & ~self._mode:
            raise _corrupt(path, f"has permissions {perms:04o}, looser than {self._mode:04o}")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            key = os.read(fd, KEY_SIZE + 1)
        finally:
            os.close(fd)
        if len(key) != KEY_SIZE:
            raise _corrupt(path, f"holds {len(key)} bytes, expected {KEY_SIZE}")
        return key

    def _open(self) -> None:
        path = self._db_path
        st = self._check_owned_regular(path)
        perms = stat.S_IMODE(st.st_mode)
        if perms & ~self._mode:
            # Holds no secrets (only keyed digests), so tightening is enough.
            log.warning("tightening %s from %04o to %04o", path, perms, self._mode)
            os.chmod(path, self._mode)
        # mode=rw: never let sqlite create an empty file in place of a vanished one.
        uri = f"file:{quote(str(path))}?mode=rw"
        # The broker may open the authority before starting its event loop thread; calls are
        # serialised by the caller (see module docstring), so the sqlite thread check only hurts.
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(
                uri, uri=True, isolation_level=None, timeout=0.2, check_same_thread=False
            )
            self._validate_and_load(conn)
        except sqlite3.Error as e:
            if conn is not None:
                conn.close()
            if e.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise AuthorityError(
                    f"{path} is in use by another process (is another broker running?)",
                    path=str(path),
                ) from None
            raise _corrupt(path, f"is not a valid authority database ({e})") from None
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        self._conn = conn

    def _validate_and_load(self, conn: sqlite3.Connection) -> None:
        path = self._db_path
        # Exclusive locking: we are the only user of this file, and the in-memory mirror
        # relies on that. It also keeps the WAL index in process memory (no -shm file).
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        check = [row[0] for row in conn.execute("PRAGMA quick_check")]
        if check != ["ok"]:
            raise _corrupt(path, f"fails its integrity check ({'; '.join(map(str, check[:3]))})")
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if app_id != APPLICATION_ID:
            raise _corrupt(path, "is not a crossintercom dedup authority database")
        if version != SCHEMA_VERSION:
            raise _corrupt(path, f"has schema version {version}, expected {SCHEMA_VERSION}")
        schema = conn.execute(
            "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
        ).fetchall()
        if schema != [("table", name, ddl) for name, ddl in _SCHEMA]:
            raise _corrupt(path, "has an unexpected schema")
        stored = dict(conn.execute("SELECT name, value FROM meta").fetchall())
        check_value = stored.get("key_check")
        if not isinstance(check_value, str) or not hmac.compare_digest(
            check_value, self._key_check()
        ):
            raise _corrupt(self._key_path, f"is not the key {self.FILE} was written with")

        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise _corrupt(path, f"cannot be switched to WAL mode (got {mode})")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA journal_size_limit=4194304")

        conn.execute("BEGIN IMMEDIATE")
        try:
            now_wall = self._wall()
            now = self._clock()
            loaded: list[tuple[float, str, _Entry]] = []
            expired: list[str] = []
            for row in conn.execute("SELECT op_id, hmac, state, outcome, expires_wall FROM ops"):
                op_id, entry, remaining = self._parse_row(row, now_wall)
                if remaining <= 0:
                    expired.append(op_id)
                else:
                    entry.deadline = now + remaining
                    loaded.append((remaining, op_id, entry))
            if expired:
                conn.executemany("DELETE FROM ops WHERE op_id = ?", [(i,) for i in expired])
            # Persist the clamp so that restarts under a backwards-jumped wall clock cannot
            # stretch a record's life beyond ttl_s from the first open.
            cap = now_wall + self._ttl
            conn.execute("UPDATE ops SET expires_wall = ? WHERE expires_wall > ?", (cap, cap))
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        loaded.sort(key=lambda item: item[0])
        for _, op_id, entry in loaded:
            self._entries[op_id] = entry
            self._bytes += entry.size

    def _parse_row(self, row: tuple[Any, ...], now_wall: float) -> tuple[str, _Entry, float]:
        op_id, digest, state, outcome, expires_wall = row

        def bad(why: str) -> AuthorityError:
            return _corrupt(self._db_path, f"corrupt record {str(op_id)[:80]!r}: {why}")

        if not isinstance(op_id, str) or not op_id or len(op_id) > MAX_OP_ID_LEN:
            raise bad("invalid operation id")
        if not isinstance(digest, str) or not _HEX_RE.fullmatch(digest):
            raise bad("invalid payload hmac")
        if state == _RESERVED:
            if outcome is not None:
                raise bad("a reservation carries an outcome")
        elif state == _ACCEPTED:
            if not isinstance(outcome, str):
                raise bad("accepted without an outcome")
            try:
                parsed = json.loads(outcome)
            except ValueError:
                raise bad("outcome is not valid JSON") from None
            if not isinstance(parsed, dict):
                raise bad("outcome is not a JSON object")
        else:
            raise bad(f"unknown state {str(state)[:20]!r}")
        if (
            not isinstance(expires_wall, int | float)
            or isinstance(expires_wall, bool)
            or not math.isfinite(expires_wall)
        ):
            raise bad("invalid expiry")
        remaining = min(max(expires_wall - now_wall, 0.0), self._ttl)
        entry = _Entry(0.0, digest, state == _ACCEPTED, _record_size(op_id, outcome))
        return op_id, entry, remaining

    def _stored_outcome(self, op_id: str) -> dict[str, Any]:
        conn = self._require_open()
        try:
            row = conn.execute("SELECT outcome FROM ops WHERE op_id = ?", (op_id,)).fetchone()
        except sqlite3.Error as e:
            raise AuthorityUnavailable(f"reading {self._db_path} failed: {e}") from e
        if row is None or not isinstance(row[0], str):
            raise _corrupt(self._db_path, f"record {op_id!r} vanished or lost its outcome")
        outcome = json.loads(row[0])
        if not isinstance(outcome, dict):
            raise _corrupt(self._db_path, f"record {op_id!r} has a non-object outcome")
        return outcome

    def _write(self, sql: str, params: list[tuple[Any, ...]]) -> None:
        """Run one statement per parameter tuple as a single transaction.

        Callers update the in-memory mirror only after this returns, so a failed write leaves
        memory and file in agreement.
        """
        conn = self._require_open()
        try:
            if len(params) == 1:
                conn.execute(sql, params[0])  # autocommit: one statement, one transaction
            else:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany(sql, params)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise AuthorityUnavailable(f"writing {self._db_path} failed: {e}") from e

    def _drop(self, op_ids: list[str]) -> None:
        self._write("DELETE FROM ops WHERE op_id = ?", [(op_id,) for op_id in op_ids])
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
