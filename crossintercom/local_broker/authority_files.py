"""The dedup authority's two files: ``delivered-messages.sqlite`` and ``delivered-messages.key``.

The two files exist together or not at all. Both are created side by side and renamed into place;
afterwards neither is ever recreated silently: a missing, foreign or damaged file, or a key
readable beyond ``file_mode``, raises ``AuthorityError`` naming the file and the reset command
(a database with loose permissions is only tightened: it holds no secrets), and ``reset`` moves
the files aside for a fresh start. The key is 32 random bytes; the database records a keyed check
of it (``meta.key_check``), so a key from elsewhere is caught on open.

The database is SQLite marked with ``application_id`` ``CIDA`` and ``user_version``
``SCHEMA_VERSION``, and holds exactly the tables of ``_SCHEMA``. Each ``ops`` row is one record:
the operation id, the hex HMAC of its payload, its state (reserved, or accepted with the outcome
as a JSON object) and its wall-clock expiry. Every statement on these tables is here, next to the
schema it depends on; the record logic in ``authority.py`` only chooses which to run.

Opening validates everything before the first row is trusted, drops expired rows, persists the
clamped expiry (see ``authority.py`` on time) and hands back the live rows for the in-memory mirror.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

from crossintercom.errors import AuthorityError
from crossintercom.runtime import bound_wal, claimed_journals, refuse_planted, set_mode
from crossintercom.testhooks import stop_at

# Logs under the authority's name: operators see one component, not how its code is laid out.
log = logging.getLogger("crossintercom.local_broker.authority")

DB_FILE = "delivered-messages.sqlite"
KEY_FILE = "delivered-messages.key"
KEY_SIZE = 32
HMAC_HEX_LEN = 64
MAX_OP_ID_LEN = 256
SCHEMA_VERSION = 1
# "CIDA": marks the file as ours, so an unrelated SQLite file is not mistaken for an authority.
APPLICATION_ID = 0x43494441
RESET_ADVICE = (
    "run `crossintercom broker --reset-authority` to move the authority files aside "
    "(retries of operations sent before the reset can then be delivered again)"
)
RESERVED = "reserved"
ACCEPTED = "accepted"
_KEY_CHECK_LABEL = b"crossintercom dedup authority key check v1"
_HEX_RE = re.compile(f"[0-9a-f]{{{HMAC_HEX_LEN}}}")
# Compared verbatim with sqlite_master: SQLite keeps the CREATE text as written.
_SCHEMA = (
    ("meta", "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"),
    (
        "ops",
        "CREATE TABLE ops (op_id TEXT PRIMARY KEY, hmac TEXT NOT NULL, state TEXT NOT NULL, "
        "outcome TEXT, expires_wall REAL NOT NULL) WITHOUT ROWID",
    ),
)
INSERT_RESERVED = (
    "INSERT INTO ops (op_id, hmac, state, outcome, expires_wall) VALUES (?, ?, ?, NULL, ?)"
)
SET_ACCEPTED = "UPDATE ops SET state = ?, outcome = ? WHERE op_id = ?"
DELETE_OP = "DELETE FROM ops WHERE op_id = ?"
SELECT_OUTCOME = "SELECT outcome FROM ops WHERE op_id = ?"


class StoredRecord(NamedTuple):
    """One live ``ops`` row as read on open, its deadline already on the caller's clock."""

    op_id: str
    digest: str
    accepted: bool
    outcome: str | None
    deadline: float


def corrupt(path: Path, why: str) -> AuthorityError:
    return AuthorityError(f"{path}: {why}; {RESET_ADVICE}", path=str(path))


def sidecars(db: Path) -> tuple[Path, Path]:
    return db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def key_check(key: bytes) -> str:
    return hmac.new(key, _KEY_CHECK_LABEL, hashlib.sha256).hexdigest()


def open_files(
    directory: Path,
    *,
    mode: int,
    ttl: float,
    wall: Callable[[], float],
    clock: Callable[[], float],
) -> tuple[bytes, sqlite3.Connection, list[StoredRecord]]:
    """Open (or, if both are absent, create) the files in ``directory``.

    Returns the key, the connection holding the database's exclusive lock, and the live records
    in deadline order. Raises ``AuthorityError`` if the files are unusable.
    """
    if not directory.is_dir():
        raise AuthorityError(f"runtime dir {directory} does not exist", path=str(directory))
    db_path = directory / DB_FILE
    key_path = directory / KEY_FILE
    db_there = os.path.lexists(db_path)
    key_there = os.path.lexists(key_path)
    if not db_there and not key_there:
        stray = [p for p in sidecars(db_path) if os.path.lexists(p)]
        if stray:
            raise corrupt(stray[0], f"left over without {DB_FILE}")
        key = _create(directory, mode)
    elif not db_there:
        raise corrupt(db_path, f"is missing but {KEY_FILE} exists")
    elif not key_there:
        raise corrupt(key_path, f"is missing but {DB_FILE} exists")
    else:
        key = _read_key(key_path, mode)
    # The WAL SQLite creates on open, and the journal of the switch to WAL, are ours first
    # (docs/operations.md); no -shm: in exclusive locking mode that index stays in memory.
    with claimed_journals(db_path, mode, None):
        conn, records = _open_db(db_path, key_path, key, mode=mode, ttl=ttl, wall=wall, clock=clock)
    return key, conn, records


def reset(runtime_dir: Path) -> list[Path]:
    """Move the authority files (and SQLite's -wal/-shm) aside; return their new paths.

    The database and its sidecars keep SQLite's naming, so the moved copy opens as a whole.
    Only call this while no broker has the authority open.
    """
    runtime_dir = Path(runtime_dir)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    db = runtime_dir / DB_FILE
    key = runtime_dir / KEY_FILE
    sources = [db, *sidecars(db), key]

    def targets(suffix: str) -> list[Path]:
        bad_db = runtime_dir / f"{DB_FILE}.bad-{suffix}"
        return [bad_db, *sidecars(bad_db), runtime_dir / f"{KEY_FILE}.bad-{suffix}"]

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
        fsync_dir(runtime_dir)
    return moved


def _create(directory: Path, mode: int) -> bytes:
    """Create key and database side by side, renaming both into place at the end.

    Only a crash between the two renames leaves one file without the other, which the next
    open reports rather than guesses about.
    """
    key = secrets.token_bytes(KEY_SIZE)
    token = secrets.token_hex(6)
    tmp_key = directory / f".{KEY_FILE}.{token}.tmp"
    tmp_db = directory / f".{DB_FILE}.{token}.tmp"
    try:
        fd = os.open(tmp_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)  # umask may have removed bits we want (group mode)
            os.write(fd, key)
            os.fsync(fd)
        finally:
            os.close(fd)
        # The database and the journal SQLite will write beside it, both ours before SQLite
        # opens them (it follows a link a member could plant at the journal's name).
        for name in (tmp_db, tmp_db.with_name(tmp_db.name + "-journal")):
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            try:
                os.fchmod(fd, mode)
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
                "INSERT INTO meta (name, value) VALUES ('key_check', ?)", (key_check(key),)
            )
            conn.execute("COMMIT")
        finally:
            conn.close()
        fd = os.open(tmp_db, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp_db, directory / DB_FILE)
        os.rename(tmp_key, directory / KEY_FILE)
        fsync_dir(directory)
    except BaseException:
        for p in (tmp_key, tmp_db, tmp_db.with_name(tmp_db.name + "-journal")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        raise
    return key


def _check_owned_regular(path: Path) -> os.stat_result:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise corrupt(path, "is not a regular file")
    if st.st_uid != os.geteuid():
        raise corrupt(path, f"is owned by uid {st.st_uid}, not by this user")
    return st


def _read_key(path: Path, mode: int) -> bytes:
    st = _check_owned_regular(path)
    perms = stat.S_IMODE(st.st_mode)
    if perms & ~mode:
        raise corrupt(path, f"has permissions {perms:04o}, looser than {mode:04o}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        key = os.read(fd, KEY_SIZE + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_SIZE:
        raise corrupt(path, f"holds {len(key)} bytes, expected {KEY_SIZE}")
    return key


def _open_db(
    path: Path,
    key_path: Path,
    key: bytes,
    *,
    mode: int,
    ttl: float,
    wall: Callable[[], float],
    clock: Callable[[], float],
) -> tuple[sqlite3.Connection, list[StoredRecord]]:
    st = _check_owned_regular(path)
    refuse_planted(path, None)  # and its -wal / -shm: SQLite would follow a planted link
    stop_at("authority.claimed")  # the race tests' moment: checked, not yet opened by SQLite
    perms = stat.S_IMODE(st.st_mode)
    if perms & ~mode:
        # Holds no secrets (only keyed digests), so tightening is enough.
        log.warning("tightening %s from %04o to %04o", path, perms, mode)
        set_mode(path, mode, only_tighten=True)
    # mode=rw: never let sqlite create an empty file in place of a vanished one.
    uri = f"file:{quote(str(path))}?mode=rw"
    # The broker may open the authority before starting its event loop thread; calls are
    # serialised by the caller (see authority.py), so the sqlite thread check only hurts.
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, timeout=0.2, check_same_thread=False
        )
        _validate(conn, path, key_path, key)
        records = _load(conn, path, ttl=ttl, wall=wall, clock=clock)
    except sqlite3.Error as e:
        if conn is not None:
            conn.close()
        if e.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise AuthorityError(
                f"{path} is in use by another process (is another broker running?)",
                path=str(path),
            ) from None
        raise corrupt(path, f"is not a valid authority database ({e})") from None
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    return conn, records


def _validate(conn: sqlite3.Connection, path: Path, key_path: Path, key: bytes) -> None:
    # Exclusive locking: we are the only user of this file, and the in-memory mirror
    # relies on that. It also keeps the WAL index in process memory (no -shm file).
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    check = [row[0] for row in conn.execute("PRAGMA quick_check")]
    if check != ["ok"]:
        raise corrupt(path, f"fails its integrity check ({'; '.join(map(str, check[:3]))})")
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if app_id != APPLICATION_ID:
        raise corrupt(path, "is not a crossintercom dedup authority database")
    if version != SCHEMA_VERSION:
        raise corrupt(path, f"has schema version {version}, expected {SCHEMA_VERSION}")
    schema = conn.execute(
        "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
    ).fetchall()
    if schema != [("table", name, ddl) for name, ddl in _SCHEMA]:
        raise corrupt(path, "has an unexpected schema")
    stored = dict(conn.execute("SELECT name, value FROM meta").fetchall())
    check_value = stored.get("key_check")
    if not isinstance(check_value, str) or not hmac.compare_digest(check_value, key_check(key)):
        raise corrupt(key_path, f"is not the key {DB_FILE} was written with")

    journal = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(journal).lower() != "wal":
        raise corrupt(path, f"cannot be switched to WAL mode (got {journal})")
    conn.execute("PRAGMA synchronous=NORMAL")
    bound_wal(conn)


def _load(
    conn: sqlite3.Connection,
    path: Path,
    *,
    ttl: float,
    wall: Callable[[], float],
    clock: Callable[[], float],
) -> list[StoredRecord]:
    """Drop expired rows, persist the clamp, and return the live rows in deadline order."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        now_wall = wall()
        now = clock()
        loaded: list[tuple[float, StoredRecord]] = []
        expired: list[str] = []
        for row in conn.execute("SELECT op_id, hmac, state, outcome, expires_wall FROM ops"):
            op_id, digest, accepted, outcome, remaining = _parse_row(path, row, now_wall, ttl)
            if remaining <= 0:
                expired.append(op_id)
            else:
                record = StoredRecord(op_id, digest, accepted, outcome, now + remaining)
                loaded.append((remaining, record))
        if expired:
            conn.executemany(DELETE_OP, [(i,) for i in expired])
        # Persist the clamp so that restarts under a backwards-jumped wall clock cannot
        # stretch a record's life beyond ttl_s from the first open.
        cap = now_wall + ttl
        conn.execute("UPDATE ops SET expires_wall = ? WHERE expires_wall > ?", (cap, cap))
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    loaded.sort(key=lambda item: item[0])
    return [record for _, record in loaded]


def _parse_row(
    path: Path, row: tuple[Any, ...], now_wall: float, ttl: float
) -> tuple[str, str, bool, str | None, float]:
    """Validate one ``ops`` row; return (op_id, hmac, accepted, outcome, remaining lifetime)."""
    op_id, digest, state, outcome, expires_wall = row

    def bad(why: str) -> AuthorityError:
        return corrupt(path, f"corrupt record {str(op_id)[:80]!r}: {why}")

    if not isinstance(op_id, str) or not op_id or len(op_id) > MAX_OP_ID_LEN:
        raise bad("invalid operation id")
    if not isinstance(digest, str) or not _HEX_RE.fullmatch(digest):
        raise bad("invalid payload hmac")
    if state == RESERVED:
        if outcome is not None:
            raise bad("a reservation carries an outcome")
    elif state == ACCEPTED:
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
    remaining = min(max(expires_wall - now_wall, 0.0), ttl)
    return op_id, digest, state == ACCEPTED, outcome, remaining
