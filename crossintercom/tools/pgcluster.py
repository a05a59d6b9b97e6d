"""A throwaway PostgreSQL cluster (initdb + pg_ctl in a temporary directory, on a port of its
own): a server a run may restart, because nobody else uses it. Never the shared server.

A cluster made from another's base backup (``pg_basebackup -R``) is a streaming standby of it:
``tools.pgreplica`` builds a primary + standby pair from these."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Self

# initdb refuses to run as root: a cluster started by root runs as the first of these that exists.
UNPRIVILEGED_USERS = ("crossintercom-test", "nobody")


def pg_bin(name: str) -> str | None:
    """A PostgreSQL server program: on PATH, else the newest under Debian's versioned dirs."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    return candidates[0] if candidates else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def existing_unprivileged_user() -> str | None:
    for name in UNPRIVILEGED_USERS:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    return None


def drop_root_prefix(user: str) -> list[str]:
    """The argv prefix that runs a program as ``user`` (its uid and gid, no other groups): how
    root starts the server programs, which refuse to run as root."""
    entry = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]


def _others_can_enter(path: Path) -> bool:
    """Every directory down to ``path`` lets other users through (the server runs as one)."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))


def _cluster_parent() -> str | None:
    """Where the cluster dir goes: the usual temp dir, unless a user the server runs as could
    not reach it (a private TMPDIR), then the system-wide one."""
    usual = Path(tempfile.gettempdir())
    if os.geteuid() != 0 or _others_can_enter(usual):
        return None
    return "/tmp"


class ThrowawayPostgres:
    """``start()`` runs initdb and the server; ``url`` is its ``postgres`` database (trust
    authentication, loopback only); ``restart()`` restarts it; ``stop()`` removes it all."""

    initdb_options: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        run_as: str | None = None,
        fsync: bool = False,
        server_settings: dict[str, str] | None = None,
    ) -> None:
        """``fsync`` off by default (tests: nothing here must survive a power cut); the bench
        keeps it on, like the shared server. ``server_settings`` become ``-c name=value``."""
        initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        self._settings = {"fsync": "on" if fsync else "off", **(server_settings or {})}
        if not initdb or not pg_ctl:
            raise RuntimeError("initdb and pg_ctl not found (install the PostgreSQL server)")
        self._initdb, self._pg_ctl = initdb, pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="ci-pg-", dir=_cluster_parent()))
        self.data = self.root / "data"
        self.port = free_port()
        self.restarts = 0
        self._prefix: list[str] = []
        if os.geteuid() == 0:
            user = run_as or existing_unprivileged_user()
            if user is None:
                shutil.rmtree(self.root, ignore_errors=True)
                raise RuntimeError(
                    f"running as root, initdb needs one of the users {UNPRIVILEGED_USERS}"
                )
            entry = pwd.getpwnam(user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._prefix = drop_root_prefix(user)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        """A server program as the user the cluster runs as; its stderr in the error."""
        try:
            return subprocess.run(
                [*self._prefix, *argv], check=True, capture_output=True, timeout=timeout
            )
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(
                f"{Path(argv[0]).name} failed: {exc.stderr.decode(errors='replace')[-800:]}"
            ) from exc

    def _ctl(self, *args: str, timeout: float = 120) -> None:
        self.run(self._pg_ctl, "-D", str(self.data), *args, timeout=timeout)

    def _make_data(self) -> None:
        """The data directory: a fresh cluster (a standby's is a base backup instead)."""
        initdb = (self._initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust")
        self.run(*initdb, "--no-sync", *self.initdb_options)

    def launch(self) -> None:
        """Start the server on the data directory as it is; returns once it accepts
        connections (a standby: once it accepts read-only ones)."""
        # The socket dir inside the cluster's own dir: the default one may not be writable.
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        opts += "".join(f" -c {name}={value}" for name, value in self._settings.items())
        self._ctl("-o", opts, "-l", str(self.root / "log"), "-w", "start")

    def halt(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data (``immediate``: as if it crashed)."""
        self._ctl("-m", mode, "-w", "stop", timeout=60)

    def wipe_data(self) -> None:
        """Remove the data directory (the server stopped), to make it again."""
        shutil.rmtree(self.data, ignore_errors=True)

    def start(self) -> Self:
        try:
            self._make_data()
            self.launch()
        except (OSError, subprocess.SubprocessError, RuntimeError):
            self.stop()
            raise
        return self

    def restart(self, mode: str = "fast") -> None:
        """Stop (``fast``: clients are disconnected, as by an operator's restart) and start
        again with the same options; returns once it accepts connections."""
        self._ctl("-m", mode, "-l", str(self.root / "log"), "-w", "restart")
        self.restarts += 1

    def stop(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError, RuntimeError):
            self._ctl("-m", "immediate", "stop", timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
