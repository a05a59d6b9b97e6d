"""FUSE mounts of one directory (Debian's ``bindfs``), each standing for one machine's view of
a shared filesystem (tests/relay/test_shared_filesystems.py).

Two bindfs mounts of one directory behave as NFS mounted ``nolock``, sshfs or an SMB share
without byte-range locks do between machines: an fcntl lock through one is invisible through
the other, and a write through one raises no inotify event on the other. Within one mount locks
do exclude (the kernel keeps them for the mount).

Without bindfs or /dev/fuse the tests are skipped on a developer's machine and fail under CI
(``CROSSINTERCOM_REQUIRE_FUSE=1``, which .ci/run sets): a shared-filesystem test that cannot run
must never pass silently there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REQUIRE_ENV = "CROSSINTERCOM_REQUIRE_FUSE"

# Takes a write lock on byte 0 of argv[1] without waiting: prints "took" or "held".
_TRY_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    print("took")
except OSError:
    print("held")
"""


def missing() -> str | None:
    """Why FUSE mounts cannot be made here, or None."""
    if shutil.which("bindfs") is None:
        return "bindfs is missing: apt-get install -y bindfs"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing: FUSE is not available on this machine"
    if shutil.which("fusermount") is None and shutil.which("fusermount3") is None:
        return "fusermount is missing: apt-get install -y fuse3"
    return None


def require() -> None:
    why = missing()
    if why is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(why)
    pytest.skip(why)


def unmount(point: Path) -> None:
    """Unmount, lazily if something still holds it (a relay that did not stop)."""
    for cmd in (["fusermount", "-u", "-z", str(point)], ["umount", "-l", str(point)]):
        with contextlib.suppress(OSError):
            if subprocess.run(cmd, capture_output=True, check=False).returncode == 0:
                return


def is_mounted(point: Path) -> bool:
    target = os.path.realpath(point)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


class SharedDir:
    """One backing directory and ``n`` bindfs mounts of it, under a short tmp dir of its own."""

    def __init__(self, n: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cifs-", dir="/tmp"))
        self.backing = self.root / "backing"
        self.backing.mkdir(mode=0o700)
        self.mounts: list[Path] = []
        try:
            for i in range(n):
                point = self.root / f"m{i}"
                point.mkdir(mode=0o700)
                subprocess.run(
                    ["bindfs", str(self.backing), str(point)],
                    check=True,
                    capture_output=True,
                    timeout=30,
                )
                self.mounts.append(point)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for point in self.mounts:
            unmount(point)
        self.mounts = [p for p in self.mounts if is_mounted(p)]
        if not self.mounts:  # never remove through a mount still up
            shutil.rmtree(self.root, ignore_errors=True)


def lock_seen(holder: Path, other: Path) -> bool:
    """Whether a lock taken on a file through ``holder`` stops another process taking it
    through ``other`` (both paths name one file, each through its mount)."""
    holder.touch()
    fd = os.open(holder, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        out = subprocess.run(
            [sys.executable, "-c", _TRY_LOCK, str(other)],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    finally:
        os.close(fd)
    return out == "held"


@contextlib.contextmanager
def shared_dir(n: int) -> Iterator[SharedDir]:
    require()
    shared = SharedDir(n)
    try:
        yield shared
    finally:
        shared.close()
