"""Auto-spawn of the broker by the first client that needs it.

``broker.spawn.lock`` holds "pid timestamp" of the spawning client so that two clients starting
at once give one broker; a lock left by a dead process, older than a minute, dated in the
future or not this user's is stale: removed, or, where the sticky group dir keeps another
member's file, passed by (the broker's own pid lock still lets only one broker run).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from crossintercom.config import ENV_GROUP, ENV_HOME, ENV_HOST_ID, Settings
from crossintercom.errors import BrokerUnavailable, RuntimeDirError
from crossintercom.local_broker.process.logcap import LOG_CAP_BYTES, trim_fd
from crossintercom.runtime import (
    ensure_runtime_dir,
    group_gid,
    modes,
    open_file,
    secure_file,
    socket_address,
)

_STALE_LOCK_S = 60.0
# A lock dated further ahead than this was not written by a spawn on this clock.
_CLOCK_SLACK_S = 5.0


def can_connect(path: Path) -> bool:
    """Whether a broker answers at ``path``; raises ``RuntimeDirError`` when a symlink or
    another file was planted there."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        with socket_address(path) as address:
            s.connect(address)
    except OSError:
        return False
    finally:
        s.close()
    return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (where nothing reaps orphans) is not a live broker
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _try_lock(path: Path, file_mode: int) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, file_mode)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {time.time():.3f}\n")
    except OSError:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return True


def _lock_is_stale(path: Path) -> bool:
    """A lock no live spawn of this user's holds: its pid dead, its time past the minute or in
    the future, or the file not a regular file of this user's (a member planted it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # a symlink, or unreadable
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return True
        pid_s, ts_s = os.read(fd, 64).decode().split()
        pid, ts = int(pid_s), float(ts_s)
    except (OSError, ValueError):
        return True  # half-written by a process that died mid-write
    finally:
        os.close(fd)
    age = time.time() - ts
    return not _pid_alive(pid) or age > _STALE_LOCK_S or age < -_CLOCK_SLACK_S


def ensure_broker(settings: Settings, timeout: float = 15.0) -> None:
    """Return once a broker answers on the socket, spawning one if needed."""
    sock = settings.socket_path
    if can_connect(sock):
        return
    try:
        _ensure_broker(settings, sock, timeout)
    except OSError as exc:
        # A full disk or an unwritable runtime dir passes: a refusal the caller retries, not a
        # crash that would end a relay's or a listener's reconnecting for good.
        raise BrokerUnavailable(
            f"could not start the broker: writing in {settings.home} failed: {exc}"
        ) from exc


def _ensure_broker(settings: Settings, sock: Path, timeout: float) -> None:
    ensure_runtime_dir(settings)
    lock = settings.file("broker.spawn.lock")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _try_lock(lock, modes(settings)[1]):
            secure_file(settings, lock)
            try:
                if not can_connect(sock):
                    _spawn_and_wait(settings, deadline)
                return
            finally:
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
        if _lock_is_stale(lock):
            try:
                lock.unlink()
            except FileNotFoundError:
                pass
            except PermissionError:
                # Another member's file in the sticky group dir: ours to pass by, not remove.
                if not can_connect(sock):
                    _spawn_and_wait(settings, deadline)
                return
            continue
        if can_connect(sock):
            return
        time.sleep(0.05)
    raise BrokerUnavailable(f"timed out waiting for the broker at {sock}")


def _spawn_and_wait(settings: Settings, deadline: float) -> None:
    log_path = settings.file("broker.log")
    env = dict(os.environ)
    env[ENV_HOME] = str(settings.home)
    env[ENV_HOST_ID] = settings.host_id
    if settings.group:
        env[ENV_GROUP] = settings.group
    # Appended to, not truncated, at each spawn: the lines of an earlier failed start are what
    # an operator needs. Trimmed to its cap here as the broker trims it while it runs.
    gid = group_gid(settings)
    fd = open_file(log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, modes(settings)[1], gid=gid)
    secure_file(settings, log_path)
    trim_fd(fd, LOG_CAP_BYTES, LOG_CAP_BYTES // 4)
    os.write(fd, f"--- spawn by pid {os.getpid()} at {time.strftime('%FT%T%z')}\n".encode())
    try:
        # A short-lived launcher starts the broker in its own session and exits, so the broker
        # is never this client's child (no zombie, no Popen left running in the client).
        out = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, sys.executable, "-m", "crossintercom.local_broker"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=fd,
            env=env,
            check=False,
            text=True,
            timeout=max(1.0, deadline - time.monotonic()),
        )
    finally:
        os.close(fd)
    try:
        pid = int(out.stdout.strip())
    except ValueError:
        raise BrokerUnavailable(f"could not start the broker: {_tail(log_path, gid)}") from None
    while time.monotonic() < deadline:
        if can_connect(settings.socket_path):
            return
        if not _pid_alive(pid):
            if can_connect(settings.socket_path):
                return  # another broker won the race for the pid lock
            raise BrokerUnavailable(f"the broker exited at start: {_tail(log_path, gid)}")
        time.sleep(0.02)
    raise BrokerUnavailable(f"the broker did not come up in time: {_tail(log_path, gid)}")


_LAUNCHER = (
    "import subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=2, stderr=2,"
    " start_new_session=True)\n"
    "print(p.pid)\n"
)


# Lines that say nothing about why a start failed (the logging module's own noise when it
# could not open its file, and the markers above).
_NOISE = ("--- Logging error ---", "--- spawn by pid", "Traceback", "  File ", "Call stack:")


def _tail(path: Path, gid: int | None = None) -> str:
    """Why the last start failed, from broker.log: its last telling line (read through
    open_file: a member's symlink there would put another file's line in our error)."""
    try:
        fd = open_file(path, os.O_RDONLY, gid=gid)
    except OSError as exc:
        return os.strerror(exc.errno or errno.EIO)
    except RuntimeDirError as exc:
        return exc.message
    with os.fdopen(fd, "rb") as f:
        text = f.read(LOG_CAP_BYTES * 2).decode(errors="replace").strip().splitlines()
    start = max(
        (i for i, line in enumerate(text) if line.startswith("--- spawn by pid")), default=-1
    )
    lines = [line for line in text[start + 1 :] if line.strip() and not line.startswith(_NOISE)]
    if any("Too many open files" in line for line in lines):
        return (
            "too many open files (EMFILE): this process or the broker ran out of file "
            "descriptors; raise the limit (ulimit -n) or close other connections"
        )
    return lines[-1] if lines else "(broker.log says nothing about this start)"
