"""What a SQLite store's trust rests on: the file's permissions (docs/operations.md, "Trust
model"). Its files are created private to their user (or to the configured group) whatever the
umask; at relay start, objects the schema does not define (a writer's triggers and views) and
files others may read or write are named in the log and in `status`."""

from __future__ import annotations

import contextlib
import grp
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from crossintercom.config import ENV_GROUP

# The triggers the schema defines (storage/schema/sqlite.sql: the archive's full-text index,
# a host row's beat_at; docs/storage.md), as stored in sqlite_master; compared with whitespace
# collapsed. Anything else is a writer's.
SCHEMA_TRIGGERS: Final = {
    "hosts_beat_at_insert": (
        "CREATE TRIGGER hosts_beat_at_insert AFTER INSERT ON hosts BEGIN "
        "UPDATE hosts SET beat_at = CURRENT_TIMESTAMP WHERE host_id = NEW.host_id; END"
    ),
    "hosts_beat_at": (
        "CREATE TRIGGER hosts_beat_at AFTER UPDATE OF heartbeat, generation ON hosts BEGIN "
        "UPDATE hosts SET beat_at = CURRENT_TIMESTAMP WHERE host_id = NEW.host_id; END"
    ),
    "archive_fts_insert": (
        "CREATE TRIGGER archive_fts_insert AFTER INSERT ON archive_messages BEGIN "
        "INSERT INTO archive_fts (rowid, subject, body) VALUES (new.seq, new.subject, new.body); "
        "END"
    ),
    "archive_fts_delete": (
        "CREATE TRIGGER archive_fts_delete AFTER DELETE ON archive_messages BEGIN "
        "INSERT INTO archive_fts (archive_fts, rowid, subject, body) "
        "VALUES ('delete', old.seq, old.subject, old.body); END"
    ),
}
# Journal files SQLite makes beside the store (only -journal in the rollback mode the store
# uses; the others if some writer switched the file to WAL).
SIDE_FILES: Final = ("-journal", "-wal", "-shm")


def configured_gid() -> int | None:
    """The group the store's files are shared with: CROSSINTERCOM_GROUP, as for the runtime dir
    (None when unset or when no such group exists here, e.g. on another host of the store)."""
    name = os.environ.get(ENV_GROUP)
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def modes(group: bool) -> tuple[int, int]:
    """(directory mode, file mode) of the store's files: the user's own, or shared with the
    configured group (setgid, so new files keep the group)."""
    return (0o2770, 0o660) if group else (0o700, 0o600)


def _squash(sql: str | None) -> str:
    return re.sub(r"\s+", " ", sql or "").strip()


def foreign_objects(rows: Iterable[tuple[str, str, str | None]]) -> list[str]:
    """Warnings for the (type, name, sql) rows of sqlite_master that are triggers or views the
    schema does not define: a writer's, and they run in every other writer's transactions."""
    out = []
    for kind, name, sql in rows:
        if kind == "trigger" and _squash(SCHEMA_TRIGGERS.get(name)) == _squash(sql):
            continue
        out.append(
            f"WARNING the store holds a {kind} the schema does not define: {name!r} "
            "(a writer of the file installed it; it may rewrite rows: drop it, "
            'docs/operations.md, "Trust model")'
        )
    return out


def loose_modes(db_path: Path, doorbells: Path) -> list[str]:
    """Warnings for the store file, its journal files and the doorbell dir where users other
    than the owner and its group may read or write them, and the store's directory when they
    may create files in it (a planted journal)."""
    out = []
    for path in (db_path, *(Path(f"{db_path}{s}") for s in SIDE_FILES), doorbells):
        try:
            mode = stat.S_IMODE(path.lstat().st_mode)
        except OSError:
            continue
        if mode & 0o006:
            out.append(
                f"WARNING {path} is {'readable' if mode & 0o004 else 'writable'} by every "
                f"local user (mode {mode:o}): whoever reads the store reads all mail; "
                f'chmod o-rwx it (docs/operations.md, "Trust model")'
            )
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(db_path.parent.stat().st_mode)
        if mode & 0o002:
            out.append(
                f"WARNING {db_path.parent} is writable by every local user (mode {mode:o}): "
                "anyone can plant the store's journal there, which SQLite writes every page a "
                "transaction changes to (all mail) or rolls back into the store (any row); "
                'chmod o-w it (docs/operations.md, "Trust model")'
            )
    return out


def create_private(path: Path, gid: int | None) -> None:
    """Create the store file empty with its final mode before SQLite does (SQLite makes it 0644
    less the umask, and its journals copy the file's mode); an existing file is left alone."""
    _, file_mode = modes(gid is not None)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, file_mode)
    except FileExistsError:
        return
    try:
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, file_mode)  # exactly: the umask took bits away at creation
    finally:
        os.close(fd)


def private_dir(path: Path, gid: int | None) -> None:
    """Create a directory of the store's with the store's modes, whatever the umask; one that
    exists is left as its owner set it (the relay warns when others may use it)."""
    dir_mode, _ = modes(gid is not None)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, dir_mode)
