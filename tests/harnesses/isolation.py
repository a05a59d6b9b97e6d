"""One test's isolated world for a real harness (the ``harness_env`` fixture builds it).

``HarnessEnv`` holds an isolated HOME, project dir and crossintercom runtime dir, the
environment to run a harness in, and finds the processes started for the test
(``leftovers()``, ``wait_all_gone()``, ``kill_all()``). ``require_harness(name)`` returns a
pinned harness's argv prefix, or skips (fails when ``CROSSINTERCOM_REQUIRE_HARNESSES=1``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import HOST_ID, _environ_of, make_env, pid_alive, wait_for
from tests.harnesses import install

__all__ = ["MARKER", "HarnessEnv", "base_env", "require_harness"]

# Put in every harness's environment: finds the processes one test started (scan of /proc).
MARKER = "CROSSINTERCOM_TEST_HARNESS_RUN"
# Inherited variables that would point a harness at a real provider, account or config.
_FOREIGN = ("ANTHROPIC_", "OPENAI_", "CLAUDE", "CODEX_", "OPENCODE", "PI_", "XDG_", "npm_")


def require_harness(name: str) -> list[str]:
    """The argv prefix that runs harness ``name``; skip (or fail, when required) if it cannot
    be installed here."""
    try:
        return install.command(name)
    except install.HarnessUnavailable as exc:
        if os.environ.get("CROSSINTERCOM_REQUIRE_HARNESSES") == "1":
            pytest.fail(f"harness {name} is required but unavailable: {exc}")
        pytest.skip(f"harness {name} unavailable: {exc}")


@dataclass
class HarnessEnv:
    """One test's isolated world for a harness run."""

    root: Path
    runtime: Path
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def work(self) -> Path:
        """The project dir harnesses run in (their cwd)."""
        return self.root / "work"

    def _started_here(self, pid: int) -> bool:
        env = _environ_of(pid)
        home = env.get("HOME", "")
        # A harness may hand its children a filtered environment (Codex's MCP servers get a
        # short allow-list plus the entry's own env): HOME and the runtime dir still tell.
        return (
            env.get(MARKER) == self.marker
            or home == str(self.home)
            or home.startswith(f"{self.home}/")
            or env.get("CROSSINTERCOM_HOME") == str(self.runtime)
        )

    def leftovers(self) -> list[int]:
        """Pids of the live processes started for this test (zombies and this one excluded)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            pid = int(entry.name)
            if self._started_here(pid) and pid_alive(pid):
                found.append(pid)
        return found

    def describe(self, pids: list[int]) -> str:
        lines = []
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                cmd = b"?"
            lines.append(f"{pid}: {cmd.decode(errors='replace')[:200]}")
        return "\n".join(lines)

    def wait_all_gone(self, timeout: float = 5) -> None:
        """Fail unless every process started for this test exits within ``timeout``."""
        wait_for(
            lambda: not self.leftovers(),
            timeout,
            lambda: "processes still running:\n" + self.describe(self.leftovers()),
        )

    def kill_all(self) -> list[int]:
        pids = self.leftovers()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids


def base_env(henv: HarnessEnv) -> dict[str, str]:
    env = make_env(henv.runtime, HOST_ID)
    for key in list(env):
        if key.startswith(_FOREIGN):
            del env[key]
    # A stale PWD makes OpenCode open the checkout instead of its cwd (kits.py sets it).
    env.pop("PWD", None)
    env.pop("OLDPWD", None)
    home = henv.home
    bindir = str(Path(sys.executable).parent)  # this checkout's `crossintercom`
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_STATE_HOME=str(home / ".local/state"),
        XDG_CACHE_HOME=str(home / ".cache"),
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', os.defpath)}",
        TERM="dumb",
        NO_COLOR="1",
        CI="1",
    )
    env[MARKER] = henv.marker
    return env
