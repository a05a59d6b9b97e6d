"""The runtime directory: creation, ownership and modes (docs/operations.md)."""

from __future__ import annotations

import fcntl
import grp
import logging
import os
import socket
import sqlite3
import stat
import uuid
from pathlib import Path

from crossintercom.config import MAX_SOCKET_PATH, Settings
from crossintercom.errors import RuntimeDirError

log = logging.getLogger(__name__)


def modes(settings: Settings) -> tuple[int, int]:
    """(directory mode, file mode): per user by default, group-shared with CROSSINTERCOM_GROUP."""
    return (0o770, 0o660) if settings.group else (0o700, 0o600)


def group_gid(settings: Settings) -> int | None:
    if not settings.group:
        return None
    try:
        return grp.getgrnam(settings.group).gr_gid
    except KeyError:
        raise RuntimeDirError(
            f"CROSSINTERCOM_GROUP names group {settings.group!r}, which does not exist"
        ) from None


def check_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise RuntimeDirError(
            f"socket path {path} is {len(os.fsencode(path))} bytes; AF_UNIX allows at most "
            f"{MAX_SOCKET_PATH}. Set CROSSINTERCOM_HOME to a shorter directory"
        )


def ensure_runtime_dir(settings: Settings) -> Path:
    """Create or check the runtime dir; refuse one owned by someone else; tighten loose modes."""
    home = settings.home
    check_socket_path(settings.socket_path)
    dir_mode, _ = modes(settings)
    gid = group_gid(settings)
    try:
        home.mkdir(mode=dir_mode, parents=True, exist_ok=True)
        st = home.lstat()
    except OSError as exc:
        raise RuntimeDirError(f"cannot create runtime dir {home}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeDirError(f"runtime dir {home} is not a directory")
    if st.st_uid != os.geteuid() and not (gid is not None and st.st_gid == gid):
        raise RuntimeDirError(
            f"runtime dir {home} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}); "
            "use your own CROSSINTERCOM_HOME"
        )
    if st.st_uid == os.geteuid():
        apply_mode(settings, home, dir_mode)
    inbox = settings.inbox_dir
    inbox.mkdir(mode=dir_mode, exist_ok=True)
    apply_mode(settings, inbox, dir_mode)
    return home


def apply_mode(settings: Settings, path: Path, mode: int) -> None:
    """Set exactly ``mode`` (and the runtime group) on a path we own; log when it was looser.

    Exact rather than only tightened: under a umask such as 022, a group deployment would
    otherwise create files its group cannot write.
    """
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        return
    current = stat.S_IMODE(st.st_mode)
    if current != mode:
        os.chmod(path, mode)
        if current & ~mode:
            log.warning(
                "mode tightened", extra={"path": str(path), "was": oct(current), "now": oct(mode)}
            )
    gid = group_gid(settings)
    if gid is not None and st.st_gid != gid:
        os.chown(path, -1, gid)


def secure_file(settings: Settings, path: Path) -> None:
    """Give a file the runtime file mode and group."""
    apply_mode(settings, path, modes(settings)[1])


def secure_tree(settings: Settings) -> None:
    """Every file the runtime dir and its inbox dir hold gets the runtime modes and group."""
    dir_mode, _ = modes(settings)
    for directory in (settings.home, settings.inbox_dir):
        apply_mode(settings, directory, dir_mode)
        for entry in directory.iterdir():
            if not entry.is_symlink() and not entry.is_dir():
                secure_file(settings, entry)


MACHINE_FILE = "machine.id"


def machine_identity(settings: Settings) -> str:
    """This machine's identity for the host row: ``hostname/random``, kept in the runtime dir.

    Two runtime dirs (two machines, a cloned VM with a fresh dir) get two identities, so a
    host id configured on both is named as a collision (docs/operations.md). A clone that
    copied the runtime dir copies this file too: delete it there.
    """
    path = settings.file(MACHINE_FILE)
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        found = ""
    if found:
        return found
    ident = f"{socket.gethostname()}/{uuid.uuid4().hex[:12]}"[:255]
    tmp = path.with_name(f"{MACHINE_FILE}.{os.getpid()}")
    tmp.write_text(ident + "\n")
    secure_file(settings, tmp)
    os.replace(tmp, path)
    return ident


# Default bound on a WAL file in the runtime dir (setting ``wal_max_bytes``).
WAL_MAX_BYTES = 1024 * 1024


def bound_wal(conn: sqlite3.Connection, max_bytes: int = WAL_MAX_BYTES) -> None:
    """Checkpoint policy for a WAL-mode file of the runtime dir (docs/operations.md).

    SQLite checkpoints once the WAL holds ``max_bytes`` of pages and then truncates the file
    back to at most ``max_bytes``; left at its defaults the file stayed at its high-water mark.
    """
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    conn.execute(f"PRAGMA wal_autocheckpoint={max(1, max_bytes // page)}")
    conn.execute(f"PRAGMA journal_size_limit={int(max_bytes)}")


def truncate_wal(conn: sqlite3.Connection) -> None:
    """Checkpoint now and empty the WAL (a periodic sweep's part of the policy above)."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


class LockHeld(RuntimeDirError):
    """Another process holds this lock."""

    code = "lock_held"

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is locked by pid {holder or '?'}", path=str(path))
        self.holder = holder


def hold_pid_lock(settings: Settings, name: str) -> int:
    """flock a file under the runtime dir for this process's lifetime and write our pid in it.

    The lock, not the file, says who runs: a file left by a dead process is simply taken.
    Raises ``LockHeld`` (with the holder's pid as written) when another process holds it.
    """
    path = settings.file(name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, modes(settings)[1])
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise LockHeld(path, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
