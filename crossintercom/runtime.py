"""The runtime directory: creation, ownership and modes (DESIGN §7)."""

from __future__ import annotations

import grp
import logging
import os
import stat
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
    if gid is not None and st.st_gid != gid and st.st_uid == os.geteuid():
        os.chown(home, -1, gid)
    current = stat.S_IMODE(st.st_mode)
    if current & ~dir_mode and st.st_uid == os.geteuid():
        os.chmod(home, dir_mode)
        log.warning(
            "runtime dir mode tightened",
            extra={"path": str(home), "was": oct(current), "now": oct(dir_mode)},
        )
    (home / "inbox").mkdir(mode=dir_mode, exist_ok=True)
    return home


def secure_file(settings: Settings, path: Path) -> None:
    """Give a file the runtime file mode (and group), tightening a looser one."""
    _, file_mode = modes(settings)
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    if stat.S_IMODE(st.st_mode) & ~file_mode:
        os.chmod(path, file_mode)
        log.warning(
            "file mode tightened",
            extra={"path": str(path), "was": oct(stat.S_IMODE(st.st_mode))},
        )
    gid = group_gid(settings)
    if gid is not None and st.st_gid != gid:
        os.chown(path, -1, gid)
