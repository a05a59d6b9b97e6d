"""The recipient's disk faults: a full filesystem and an inbox that cannot be written.

Both are real (docs/reliability.md): ``disk_full`` runs each host's runtime dir on a small tmpfs
the run mounts, and fills it with a file, later removed; ``inbox_readonly`` makes the sink's
inbox files immutable (``chattr +i``: root ignores file modes, and a read-only remount is
refused while files are open for writing). Both need root, so this machine may not have them:
``unavailable`` says why instead of letting the run pass without them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path

from crossintercom.tools.chaos.state import SINK
from crossintercom.tools.harness import SimHost

DISK_KINDS = ("inbox_readonly", "disk_full")
TMPFS_MIB = 64


def _run(*cmd: str) -> str | None:
    """Run a command; None when it worked, else what it said."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return None
    return (proc.stderr or proc.stdout).strip() or f"{cmd[0]} exited {proc.returncode}"


def mount_tmpfs(path: Path) -> str | None:
    """Mount a TMPFS_MIB tmpfs on ``path``; None when it worked, else why not."""
    return _run("mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m,mode=0700", "tmpfs", str(path))


def unmount(path: Path) -> None:
    _run("umount", "-l", str(path))


def chattr(flag: str, *paths: Path) -> str | None:
    return _run("chattr", flag, *map(str, paths))


def unavailable(root: Path, kinds: list[str]) -> dict[str, str]:
    """Why each disk fault kind of ``kinds`` cannot be injected here (none: all can), found by
    trying: a tmpfs mounted under ``root``, and a file in it (or in ``root``) made immutable."""
    wanted = [k for k in kinds if k in DISK_KINDS]
    if not wanted:
        return {}
    if os.geteuid() != 0:
        return dict.fromkeys(wanted, "needs root (mount a tmpfs, chattr +i)")
    why: dict[str, str] = {}
    probe = root / "probe-mount"
    probe.mkdir()
    mounted = False
    try:
        if shutil.which("mount") is None:
            why["disk_full"] = "no mount command"
        elif (failed := mount_tmpfs(probe)) is not None:
            why["disk_full"] = f"mount -t tmpfs refused: {failed}"
        else:
            mounted = True
        # Where the inboxes will be: on the tmpfs when the run mounts one.
        where = probe if mounted and "disk_full" in wanted else root
        if shutil.which("chattr") is None:
            why["inbox_readonly"] = "no chattr command"
        else:
            f = where / "probe-file"
            f.write_bytes(b"")
            if (failed := chattr("+i", f)) is not None:
                why["inbox_readonly"] = f"chattr +i refused: {failed}"
            chattr("-i", f)
            f.unlink()
    finally:
        if mounted:
            unmount(probe)
        with contextlib.suppress(OSError):
            probe.rmdir()
    return {k: v for k, v in why.items() if k in wanted}


def fill(directory: Path) -> Path:
    """Write a file until the run's small tmpfs at ``directory`` is full; returns the file."""
    # Never a real disk: only a tmpfs this run mounted, and a small one.
    if not os.path.ismount(directory):
        raise RuntimeError(f"{directory} is not the run's tmpfs")
    st = os.statvfs(directory)
    if st.f_blocks * st.f_frsize > TMPFS_MIB * 1024 * 1024:
        raise RuntimeError(f"{directory} is larger than the run's tmpfs")
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler


def sink_inbox_files(host: SimHost) -> list[Path]:
    return sorted(host.settings.inbox_dir.glob(f"{host.session_id(SINK)}.sqlite*"))


class Immutable:
    """The files made immutable and not yet released, so that the run always releases them."""

    def __init__(self) -> None:
        self.held: set[Path] = set()

    def make(self, files: list[Path]) -> bool:
        if chattr("+i", *files) is not None:
            chattr("-i", *files)
            return False
        self.held.update(files)
        return True

    def release(self, files: list[Path]) -> None:
        chattr("-i", *files)
        self.held.difference_update(files)

    def release_all(self) -> None:
        if self.held:
            self.release(sorted(self.held))
