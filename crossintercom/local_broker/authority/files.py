"""The dedup authority's two files: ``delivered-messages.sqlite`` and ``delivered-messages.key``.

The two files exist together or not at all. Both are created side by side and renamed into place;
afterwards neither is ever recreated silently: a missing, foreign or damaged file, or a key
readable beyond ``file_mode``, raises ``AuthorityError`` naming the file and the reset command
(a database with loose permissions is only tightened: it holds no secrets), and ``reset`` moves
the files aside for a fresh start. The key is 32 random bytes; the database records a keyed check
of it (``meta.key_check``), so a key from elsewhere is caught on open.

The database's format (marks, tables, every statement on them, what a row must be) is
``schema``'s; the record logic in ``dedup.py`` only chooses which statement to run.

Opening validates everything before the first row is trusted, drops expired rows, persists the
clamped expiry (see ``dedup.py`` on time) and hands back the live rows for the in-memory mirror.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from crossintercom.errors import AuthorityError
from crossintercom.local_broker.authority import schema
from crossintercom.runtime import claimed_journals, refuse_planted, set_mode
from crossintercom.testhooks import stop_at

# Logs under the authority's name: operators see one component, not how its code is laid out.
log = logging.getLogger("crossintercom.local_broker.authority.dedup")


def sidecars(db: Path) -> tuple[Path, Path]:
    return db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_files(
    directory: Path,
    *,
    mode: int,
    ttl: float,
    wall: Callable[[], float],
    clock: Callable[[], float],
) -> tuple[bytes, sqlite3.Connection, list[schema.StoredRecord]]:
    """Open (or, if both are absent, create) the files in ``directory``.

    Returns the key, the connection holding the database's exclusive lock, and the live records
    in deadline order. Raises ``AuthorityError`` if the files are unusable.
    """
    if not directory.is_dir():
        raise AuthorityError(f"runtime dir {directory} does not exist", path=str(directory))
    db_path = directory / schema.DB_FILE
    key_path = directory / schema.KEY_FILE
    db_there = os.path.lexists(db_path)
    key_there = os.path.lexists(key_path)
    if not db_there and not key_there:
        stray = [p for p in sidecars(db_path) if os.path.lexists(p)]
        if stray:
            raise schema.corrupt(stray[0], f"left over without {schema.DB_FILE}")
        key = _create(directory, mode)
    elif not db_there:
        raise schema.corrupt(db_path, f"is missing but {schema.KEY_FILE} exists")
    elif not key_there:
        raise schema.corrupt(key_path, f"is missing but {schema.DB_FILE} exists")
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
    db = runtime_dir / schema.DB_FILE
    key = runtime_dir / schema.KEY_FILE
    sources = [db, *sidecars(db), key]

    def targets(suffix: str) -> list[Path]:
        bad_db = runtime_dir / f"{schema.DB_FILE}.bad-{suffix}"
        return [bad_db, *sidecars(bad_db), runtime_dir / f"{schema.KEY_FILE}.bad-{suffix}"]

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
    key = secrets.token_bytes(schema.KEY_SIZE)
    token = secrets.token_hex(6)
    tmp_key = directory / f".{schema.KEY_FILE}.{token}.tmp"
    tmp_db = directory / f".{schema.DB_FILE}.{token}.tmp"
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
            conn.execute(f"PRAGMA application_id={schema.APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={schema.SCHEMA_VERSION}")
            for _, ddl in schema.TABLES:
                conn.execute(ddl)
            conn.execute(
                "INSERT INTO meta (name, value) VALUES ('key_check', ?)", (schema.key_check(key),)
            )
            conn.execute("COMMIT")
        finally:
            conn.close()
        fd = os.open(tmp_db, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp_db, directory / schema.DB_FILE)
        os.rename(tmp_key, directory / schema.KEY_FILE)
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
        raise schema.corrupt(path, "is not a regular file")
    if st.st_uid != os.geteuid():
        raise schema.corrupt(path, f"is owned by uid {st.st_uid}, not by this user")
    return st


def _read_key(path: Path, mode: int) -> bytes:
    st = _check_owned_regular(path)
    perms = stat.S_IMODE(st.st_mode)
    if perms & ~mode:
        raise schema.corrupt(path, f"has permissions {perms:04o}, looser than {mode:04o}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        key = os.read(fd, schema.KEY_SIZE + 1)
    finally:
        os.close(fd)
    if len(key) != schema.KEY_SIZE:
        raise schema.corrupt(path, f"holds {len(key)} bytes, expected {schema.KEY_SIZE}")
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
) -> tuple[sqlite3.Connection, list[schema.StoredRecord]]:
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
    # serialised by the caller (see dedup.py), so the sqlite thread check only hurts.
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(
            uri, uri=True, isolation_level=None, timeout=0.2, check_same_thread=False
        )
        schema.validate(conn, path, key_path, key)
        records = _load(conn, path, ttl=ttl, wall=wall, clock=clock)
    except sqlite3.Error as e:
        if conn is not None:
            conn.close()
        if e.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise AuthorityError(
                f"{path} is in use by another process (is another broker running?)",
                path=str(path),
            ) from None
        raise schema.corrupt(path, f"is not a valid authority database ({e})") from None
    except BaseException:
        if conn is not None:
            conn.close()
        raise
    return conn, records


def _load(
    conn: sqlite3.Connection,
    path: Path,
    *,
    ttl: float,
    wall: Callable[[], float],
    clock: Callable[[], float],
) -> list[schema.StoredRecord]:
    """Drop expired rows, persist the clamp, and return the live rows in deadline order."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        now_wall = wall()
        now = clock()
        loaded: list[tuple[float, schema.StoredRecord]] = []
        expired: list[str] = []
        for row in conn.execute("SELECT op_id, hmac, state, outcome, expires_wall FROM ops"):
            op_id, digest, accepted, outcome, remaining = schema.parse_row(path, row, now_wall, ttl)
            if remaining <= 0:
                expired.append(op_id)
            else:
                record = schema.StoredRecord(op_id, digest, accepted, outcome, now + remaining)
                loaded.append((remaining, record))
        if expired:
            conn.executemany(schema.DELETE_OP, [(i,) for i in expired])
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
