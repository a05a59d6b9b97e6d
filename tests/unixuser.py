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


# A third user, for a runtime dir that nobody owns while another member plants files in it
# (root ignores the sticky bit, so only two unprivileged users show what it does).
OTHER_USER: Final = "daemon"


def as_nobody(
    *argv: str, groups: tuple[int, ...] = (), timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """``argv`` run as nobody (its own group, plus ``groups``), no capabilities."""
    return as_user("nobody", *argv, groups=groups, timeout=timeout)


def as_user(
    user: str,
    *argv: str,
    groups: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    """``argv`` run as ``user`` (its own group, plus ``groups``), no capabilities."""
    return subprocess.run(
        _setpriv(user, groups, argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def python_for(user: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """An interpreter ``user`` can run, with this tree's packages, and ``env`` for it: this
    one, or (when it lives where ``user`` cannot reach) the system's of the same version with
    this one's packages on PYTHONPATH, so processes it spawns run too; skips if neither."""
    probe = "import os, sys; sys.exit(not os.access(sys.executable, os.X_OK))"
    if as_user(user, sys.executable, "-c", probe, env=env).returncode == 0:
        return [sys.executable], env
    system = Path(f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}")
    if not system.exists():
        pytest.skip(f"{user} cannot run {sys.executable} and there is no {system}")
    root = Path(__file__).resolve().parents[1]
    paths = [p for p in sys.path if p.endswith("site-packages")] + [str(root)]
    return [str(system)], {**env, "PYTHONPATH": os.pathsep.join(paths)}


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


def spawn_as_user(
    user: str, *argv: str, groups: tuple[int, ...] = (), env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``argv`` started as ``user`` like ``as_user``, left running (an attacker that keeps at
    it while the test's own process works)."""
    return subprocess.Popen(
        _setpriv(user, groups, argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _setpriv(user: str, groups: tuple[int, ...], argv: tuple[str, ...]) -> list[str]:
    entry = pwd.getpwnam(user)
    group_opt = ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
    ids = [f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}"]
    return ["setpriv", *ids, *group_opt, "--inh-caps=-all", "--", *argv]
