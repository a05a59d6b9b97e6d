"""How a session's inbox file is opened: its schema, its file mode, its journal.

The file's contents are read and written by ``Inbox`` (inbox.py); this module only makes a
connection to it ready, for writing by its owner or for reading by anyone.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import stat
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import tenacity

from crossintercom.config import synchronous_pragma
from crossintercom.errors import RuntimeDirError
from crossintercom.runtime import check_plain, open_file, refuse_planted, set_mode
from crossintercom.runtime_sqlite import connect_claimed

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
    """A connection that can only read ``path``; an inbox not written yet reads as empty.

    SQLite opens a file by name and follows a symlink in it (it even resolves
    ``/proc/self/fd/N`` back to a name), so a member who swaps its own inbox for a link between
    any check and SQLite's open would have this process open another file. Only a file of this
    user's in a dir where no one else can replace it is opened by name; another's is opened
    here without following a link, checked on the descriptor and copied, under SQLite's shared
    lock, into a private file SQLite reads (docs/operations.md, "Files in the runtime dir")."""
    db = _connect_pinned(path)
    if db is not None:
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'entries'").fetchone():
            return db
        db.close()  # created by its owner, who has not written the schema yet
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    db.execute("PRAGMA query_only = ON")
    return db


def _connect_pinned(path: Path) -> sqlite3.Connection | None:
    """A read-only connection to the inode found at ``path`` now, or None when there is none
    or it was refused (logged)."""
    st = path.parent.stat()
    gid = st.st_gid if st.st_mode & 0o070 else None
    try:
        # O_PATH: closing it never drops a lock this process holds on the file through SQLite.
        pin = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        found = os.fstat(pin)
        check_plain(path, found, gid)
        if found.st_uid == os.geteuid() and (st.st_mode & stat.S_ISVTX or not st.st_mode & 0o022):
            # Nobody but us (or the dir's owner) can replace our file here: read it in place.
            refuse_planted(path, gid)
            return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30.0)
        fd = os.open(f"/proc/self/fd/{pin}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return _private_copy(path, fd, gid)
        finally:
            os.close(fd)
    except RuntimeDirError as exc:
        log.warning("inbox file refused", extra={"path": str(path), "why": str(exc)})
        return None
    finally:
        os.close(pin)


# SQLite's lock bytes (its file format's "locking" section): readers hold a shared lock on
# one byte of SHARED, taken while holding PENDING; a writer holds RESERVED while it journals.
_PENDING = 0x40000000
_RESERVED = _PENDING + 1
_SHARED = _PENDING + 2
_SHARED_SIZE = 510
_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
_LOCK_WAIT = 30.0


def _private_copy(path: Path, fd: int, gid: int | None) -> sqlite3.Connection | None:
    """Copy the file ``fd`` holds, as of one committed state, into a file only we can reach,
    and open that (deleted at once: the connection keeps it until closed)."""
    with _shared_lock(fd):
        if _hot_journal(path, fd, gid):
            raise sqlite3.OperationalError(
                f"{path} has a hot journal: its owner rolls it back on its next open"
            )
        private = Path(tempfile.mkdtemp(prefix="inbox-view-"))
        copy = private / "inbox.sqlite"
        try:
            out = os.open(copy, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                offset = 0
                while n := os.sendfile(out, fd, offset, 1 << 24):
                    offset += n
                # A WAL-mode header (an inbox of another version) reads the main file only.
                if os.pread(out, 2, 18) == b"\2\2":
                    os.pwrite(out, b"\1\1", 18)
            finally:
                os.close(out)
            return sqlite3.connect(f"{copy.as_uri()}?mode=ro&immutable=1", uri=True)
        finally:
            copy.unlink(missing_ok=True)
            private.rmdir()


@contextlib.contextmanager
def _shared_lock(fd: int) -> Iterator[None]:
    """SQLite's shared lock on the file ``fd`` holds, as open-file-description locks: they
    conflict with SQLite's own in any process, and closing ``fd`` releases nothing else."""
    deadline = time.monotonic() + _LOCK_WAIT
    pause = 0.001
    while True:
        if _ofd_lock(fd, fcntl.F_RDLCK, _PENDING, 1):
            got = _ofd_lock(fd, fcntl.F_RDLCK, _SHARED, _SHARED_SIZE)
            _ofd_lock(fd, fcntl.F_UNLCK, _PENDING, 1)
            if got:
                break
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError("database is locked")
        time.sleep(pause)  # a writer holds it: back off as SQLite's busy handler does
        pause = min(pause * 2, 0.05)
    try:
        yield
    finally:
        _ofd_lock(fd, fcntl.F_UNLCK, _SHARED, _SHARED_SIZE)


def _flock(kind: int, start: int, length: int) -> bytes:
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, start, length, 0)


def _ofd_lock(fd: int, kind: int, start: int, length: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock(kind, start, length))
    except (BlockingIOError, PermissionError):
        return False
    return True


def _hot_journal(path: Path, fd: int, gid: int | None) -> bool:
    """A journal left by a writer that died mid-commit (no one holds RESERVED): the file may
    hold half a transaction until its owner rolls it back. A planted journal is refused."""
    journal = Path(f"{path}-journal")
    try:
        jfd = open_file(journal, os.O_RDONLY, gid=gid)
    except FileNotFoundError:
        return False
    try:
        if os.pread(jfd, len(_JOURNAL_MAGIC), 0) != _JOURNAL_MAGIC:
            return False
    finally:
        os.close(jfd)
    probe = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock(fcntl.F_WRLCK, _RESERVED, 1))
    return bool(struct.unpack("hhqqi4x", probe)[0] == fcntl.F_UNLCK)


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
    db, fresh = connect_claimed(
        path, file_mode, gid, ("-journal",), timeout=30.0, isolation_level=None
    )
    try:
        if not fresh:
            tighten(path, file_mode)
        _prepare(db, synchronous)
        tighten(path.with_name(path.name + "-journal"), file_mode)
    except BaseException:
        db.close()
        raise
    return db
