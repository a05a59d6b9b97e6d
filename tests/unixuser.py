"""A second Unix user for attack tests: `nobody`, optionally a member of one more group,
running a command with setpriv (root only; the tests that need it skip otherwise)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

# A group that exists on every Debian-like system and that nobody is not a member of.
SHARED_GROUP: Final = "users"


def need_root() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as a second Unix user")


def as_nobody(
    *argv: str, groups: tuple[int, ...] = (), timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """``argv`` run as nobody (its own group, plus ``groups``), no capabilities."""
    nobody = pwd.getpwnam("nobody")
    group_opt = ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
    cmd = [
        "setpriv",
        f"--reuid={nobody.pw_uid}",
        f"--regid={nobody.pw_gid}",
        *group_opt,
        "--inh-caps=-all",
        "--",
        *argv,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def python_as_nobody(
    code: str, *args: str, groups: tuple[int, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return as_nobody(sys.executable, "-c", code, *args, groups=groups)


def open_dir(path: Path) -> Path:
    """A directory any user may enter (so only the files' own modes keep nobody out)."""
    path.mkdir(parents=True, exist_ok=True)
    for part in (path, *path.parents):
        if part == Path("/"):
            break
        part.chmod(part.stat().st_mode | 0o711)
    return path
