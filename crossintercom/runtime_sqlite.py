"""SQLite files of the runtime dir that another member owns, opened for writing.

SQLite opens a file by name and follows a symlink in it, and a member may replace its own
file in the sticky group dir: between our checks and SQLite's open it can swap in a link
(docs/operations.md, "Files in the runtime dir"). A file of ours nobody else can replace; a
member's is opened without creating anything (``mode=rw``), and the connection is used only
if SQLite holds the very inode checked, under the name asked for.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

from crossintercom.errors import RuntimeDirError
from crossintercom.runtime import check_plain, claim_sqlite

_FDS = "/proc/self/fd"


def connect_claimed(
    path: Path, mode: int, gid: int | None, sides: tuple[str, ...], **kwargs: Any
) -> tuple[sqlite3.Connection, bool]:
    """``claim_sqlite`` then ``sqlite3.connect``; returns the connection and whether the file
    was new. Raises ``RuntimeDirError`` when a member's file was swapped in between."""
    fresh = claim_sqlite(path, mode, gid, sides)
    # O_PATH: closing it never drops the locks SQLite holds on the file in this process.
    pin = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(pin)
        check_plain(path, st, gid)
        if st.st_uid == os.geteuid():
            return sqlite3.connect(path, **kwargs), fresh
        before = set(os.listdir(_FDS))
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=rw", uri=True, **kwargs)
    finally:
        os.close(pin)
    named = db.execute("PRAGMA database_list").fetchone()[2]
    # SQLite names the file with every link resolved: the dir's own (say, a linked home) too.
    asked = os.path.join(os.path.realpath(path.parent), path.name)
    if named != asked or not _opened(before, st):
        db.close()
        raise RuntimeDirError(
            f"refusing to open {path}: it was replaced while being opened (planted in the "
            "runtime dir?); remove it",
            path=str(path),
        )
    return db, fresh


def _opened(before: set[str], st: os.stat_result) -> bool:
    """SQLite, connecting, opened the file ``st`` describes: a descriptor new since ``before``
    holds it or, when no regular file was opened (SQLite reuses a descriptor it keeps for a
    file this process still has locked), one already open does."""
    after = _regular_fds(set(os.listdir(_FDS)))
    new = {fd: ids for fd, ids in after.items() if fd not in before}
    held = (st.st_dev, st.st_ino)
    return held in new.values() or (not new and held in after.values())


def _regular_fds(fds: set[str]) -> dict[str, tuple[int, int]]:
    found = {}
    for fd in fds:
        try:
            got = os.stat(f"{_FDS}/{fd}")
        except OSError:
            continue
        if stat.S_ISREG(got.st_mode):
            found[fd] = (got.st_dev, got.st_ino)
    return found
