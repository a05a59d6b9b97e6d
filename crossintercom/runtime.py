"""The runtime directory: creation, ownership and modes (docs/operations.md)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import logging
import os
import secrets
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

from crossintercom.config import CONFIG_FILE, MAX_SOCKET_PATH, Settings
from crossintercom.errors import Code, RuntimeDirError

log = logging.getLogger(__name__)


def modes(settings: Settings) -> tuple[int, int]:
    """(directory mode, file mode): per user by default, group-shared with CROSSINTERCOM_GROUP.
    The group's directories are sticky, so no member can rename or delete another's files
    (docs/operations.md, "Files in the runtime dir")."""
    return (0o1770, 0o660) if settings.group else (0o700, 0o600)


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
    ensure_subdir(settings, settings.inbox_dir)
    return home


def ensure_subdir(settings: Settings, path: Path, *, own: bool = False) -> Path:
    """Create or check a directory inside the runtime dir, with the runtime dir mode: a real
    directory (a symlink planted in its place would have files created wherever it points),
    this user's or, unless ``own``, the runtime group's."""
    dir_mode, _ = modes(settings)
    gid = group_gid(settings)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=dir_mode)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or (
        st.st_uid != os.geteuid() and (own or gid is None or st.st_gid != gid)
    ):
        raise RuntimeDirError(
            f"{path} is not a directory of this runtime dir's (planted?); remove it",
            path=str(path),
        )
    apply_mode(settings, path, dir_mode)
    return path


def apply_mode(settings: Settings, path: Path, mode: int) -> None:
    """Set exactly ``mode`` (and the runtime group) on a path we own; log when it was looser.

    Exact rather than only tightened: under a umask such as 022, a group deployment would
    otherwise create files its group cannot write."""
    was = set_mode(path, mode, group_gid(settings))
    if was is not None:
        log.warning("mode tightened", extra={"path": str(path), "was": oct(was), "now": oct(mode)})


def set_mode(
    path: Path, mode: int, gid: int | None = None, *, only_tighten: bool = False
) -> int | None:
    """Set ``mode`` (and ``gid``) on a path of ours; with ``only_tighten``, only take bits away.
    Returns the mode it had when that was looser than ``mode``, else None.

    The path is pinned first without following a symlink (O_PATH | O_NOFOLLOW), so a member
    who swaps in a symlink between the check and the change gets nothing changed through it.
    """
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
            return None
        pinned = f"/proc/self/fd/{fd}"  # the inode the fd holds, whatever the name now is
        current = stat.S_IMODE(st.st_mode)
        if current != mode and not (only_tighten and not current & ~mode):
            os.chmod(pinned, current & mode if only_tighten else mode)
        if gid is not None and st.st_gid != gid:
            os.chown(pinned, -1, gid)
    finally:
        os.close(fd)
    return current if current & ~mode else None


def secure_file(settings: Settings, path: Path) -> None:
    """Give a file the runtime file mode and group (a private file stays 0600, config.json
    stays unwritable by the group: members read it, never change it)."""
    mode = 0o600 if path.name in PRIVATE_FILES else modes(settings)[1]
    if path.name == CONFIG_FILE:
        mode &= 0o640
    apply_mode(settings, path, mode)


def secure_tree(settings: Settings) -> None:
    """Every file the runtime dir and its inbox dir hold gets the runtime modes and group."""
    dir_mode, _ = modes(settings)
    for directory in (settings.home, settings.inbox_dir):
        apply_mode(settings, directory, dir_mode)
        for entry in directory.iterdir():
            if not entry.is_symlink() and not entry.is_dir():
                secure_file(settings, entry)


# Files only their owner may read, also in a group runtime dir: the web page's access token and
# the key it is derived from (kept, so a restarted page keeps its token; docs/web.md).
WEB_TOKEN_FILE = "web.token"
WEB_KEY_FILE = "web.key"
PRIVATE_FILES = frozenset({WEB_TOKEN_FILE, WEB_KEY_FILE})
# A file of the runtime dir is opened only if it is this: never through a symlink, never a
# hard link to a file elsewhere, never another user's file outside the runtime group.
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def open_file(path: Path, flags: int, mode: int = 0o600, *, gid: int | None = None) -> int:
    """``os.open`` for a file of the runtime dir that refuses what a member of a group runtime
    dir could plant there (a symlink to another file, a hard link, a FIFO, a file of a user
    outside the group): raises ``RuntimeDirError`` naming it. ``gid``: the runtime group, whose
    members' files are accepted too. O_NONBLOCK only keeps a planted FIFO from blocking the
    open; it changes nothing for a regular file."""
    try:
        fd = os.open(path, flags | _NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(path, "it is a symlink") from None
        raise
    try:
        check_plain(path, os.fstat(fd), gid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_plain(path: Path, st: os.stat_result, gid: int | None) -> None:
    """Refuse what is not a plain file of this user's (or of the runtime group)."""
    _check_node(path, st, stat.S_ISREG(st.st_mode), "a regular file")
    if st.st_uid != os.geteuid() and (gid is None or st.st_gid != gid):
        raise _refused(path, f"it belongs to uid {st.st_uid}")


def _check_node(path: Path, st: os.stat_result, right_kind: bool, kind: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _refused(path, "it is a symlink")
    if not right_kind:
        raise _refused(path, f"it is not {kind}")
    if st.st_nlink != 1:
        raise _refused(path, "it is a hard link to another file")


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address to connect to the socket at ``path`` by, pinned without following a symlink
    (``connect`` follows one: a member's link would have this process talk to any socket it
    may reach). Raises ``FileNotFoundError`` when there is none, ``RuntimeDirError`` when what
    is there is not a socket. Its owner is not checked: any member may run the broker."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        _check_node(path, st, stat.S_ISSOCK(st.st_mode), "a socket")
        yield f"/proc/self/fd/{fd}"  # the inode the fd holds, whatever the name now is
    finally:
        os.close(fd)


SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm")


def refuse_planted(path: Path, gid: int | None) -> None:
    """Before SQLite opens ``path`` (which it does following symlinks): the file and its
    journal files, where they exist, must pass ``open_file``'s checks. In a sticky group dir no
    member can replace them once they are ours; a name not yet taken could hold a link."""
    for candidate in (path, *(Path(f"{path}{s}") for s in SQLITE_SIDE_FILES)):
        try:
            st = candidate.lstat()
        except FileNotFoundError:
            continue
        check_plain(candidate, st, gid)


def claim_sqlite(path: Path, mode: int, gid: int | None, sides: tuple[str, ...] = ()) -> bool:
    """Before SQLite opens a file of the runtime dir: create it (exactly ``mode``, whatever
    the umask) or find it through ``open_file``'s checks, so a link a member plants in its name
    is refused rather than followed; the same for the journal files named in ``sides`` (which
    SQLite would otherwise create later, following a link planted meanwhile; it reads an
    empty one as none), then check the others (``refuse_planted``). Returns True when the
    file was new (SQLite reads an empty file as an empty database)."""
    fresh = claim_file(path, mode, gid)
    for side in sides:
        claim_file(Path(f"{path}{side}"), mode, gid)
    refuse_planted(path, gid)
    return fresh


def claim_file(path: Path, mode: int, gid: int | None) -> bool:
    """Create ``path`` (exactly ``mode``, in group ``gid``: the sticky dir does not pass its
    group on, and the other members accept only the runtime group's files) or find it through
    ``open_file``'s checks; True when it was new."""
    try:
        fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode, gid=gid)
        fresh = True
    except FileExistsError:
        fd = open_file(path, os.O_RDWR, mode, gid=gid)
        fresh = False
    try:
        if fresh:
            if gid is not None:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)  # exactly, whatever the umask
    finally:
        os.close(fd)
    return fresh


@contextlib.contextmanager
def claimed_journals(db: Path, mode: int, gid: int | None) -> Iterator[None]:
    """``claim_file`` for the journals SQLite creates when it opens ``db`` in WAL mode: the
    WAL and, until the header says WAL, the journal of the switch (it reads an empty one as
    none). Those that were new and are still empty are removed when what follows fails: a
    refused open leaves the dir as it was."""
    sides = ("-wal",) if _header(db, 18, 2) == b"\2\2" else ("-wal", "-journal")
    fresh = [p for p in (Path(f"{db}{s}") for s in sides) if claim_file(p, mode, gid)]
    try:
        yield
    except BaseException:
        for path in fresh:
            with contextlib.suppress(OSError):
                if os.lstat(path).st_size == 0:
                    os.unlink(path)
        raise


def _header(path: Path, offset: int, size: int) -> bytes:
    """Bytes of a file's header, read without following a link (empty when unreadable)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)
    return b""


def _refused(path: Path, why: str) -> RuntimeDirError:
    return RuntimeDirError(
        f"refusing to open {path}: {why} (planted in the runtime dir?); remove it",
        path=str(path),
    )


def replace_file(path: Path, data: bytes, mode: int, *, gid: int | None = None) -> None:
    """Write ``path`` whole through a new temporary file beside it, created exclusively (never
    one someone placed there) with exactly ``mode`` and ``gid``, then renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode & 0o600)
    try:
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)  # exactly, whatever the umask
        os.write(fd, data)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


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


# The smallest filesystem the runtime dir should be on (docs/operations.md, "Runtime dir size"):
# the host's own files take up to about 4 MiB (two WALs of ``wal_max_bytes`` and their
# databases), and a message being saved needs its size twice over (inbox and journal), with
# a little room left for inboxes to grow. Below it the broker and the relay warn at start and
# `status` says so.
MIN_RUNTIME_DIR_BYTES = 8 * 1024 * 1024


def fitted_wal_bytes(home: Path, max_bytes: int) -> int:
    """``max_bytes`` for a WAL of the runtime dir, or less on a filesystem under the minimum: a
    sixteenth of it (at least 32 KiB), so the two WALs never hold the space a checkpoint needs
    to empty them, or that saving mail needs once a filled disk has room again."""
    try:
        st = os.statvfs(home)
    except OSError:
        return max_bytes
    size = st.f_blocks * st.f_frsize
    if size >= MIN_RUNTIME_DIR_BYTES:
        return max_bytes
    return min(max_bytes, max(32 * 1024, size // 16))


def runtime_dir_too_small(home: Path) -> str | None:
    """A warning when the filesystem under ``home`` is smaller than MIN_RUNTIME_DIR_BYTES."""
    try:
        st = os.statvfs(home)
    except OSError:
        return None  # said elsewhere (status: "runtime dir unreadable")
    size = st.f_blocks * st.f_frsize
    if size >= MIN_RUNTIME_DIR_BYTES:
        return None
    return (
        f"runtime dir {home} is on a filesystem of {size // 1024} KiB, under the "
        f"{MIN_RUNTIME_DIR_BYTES // (1024 * 1024)} MiB it needs: this host's own files can "
        'fill it and leave no room to save mail (docs/operations.md, "Runtime dir size")'
    )


def truncate_wal(conn: sqlite3.Connection) -> None:
    """Checkpoint now and empty the WAL (a periodic sweep's part of the policy above)."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


class LockHeld(RuntimeDirError):
    """Another process holds this lock."""

    code = Code.LOCK_HELD

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is locked by pid {holder or '?'}", path=str(path))
        self.holder = holder


def hold_pid_lock(settings: Settings, name: str) -> int:
    """flock a file under the runtime dir for this process's lifetime and write our pid in it.

    The lock, not the file, says who runs: a file left by a dead process is simply taken.
    Raises ``LockHeld`` (with the holder's pid as written) when another process holds it.
    """
    path = settings.file(name)
    fd = open_file(path, os.O_RDWR | os.O_CREAT, modes(settings)[1], gid=group_gid(settings))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise LockHeld(path, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
