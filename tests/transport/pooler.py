"""A real PgBouncer (Debian's ``pgbouncer``) on a port of its own, in front of the tests'
PostgreSQL, in session or transaction mode. Run as an unprivileged user when the tests run as
root (PgBouncer refuses root), with its files in a directory of its own."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal, Self

import psycopg
from sqlalchemy.engine import make_url

from crossintercom.tools.pgcluster import drop_root_prefix, free_port
from tests.pgharness import _unprivileged_user, pg_unavailable

PGBOUNCER = "/usr/sbin/pgbouncer"
Mode = Literal["session", "transaction", "statement"]


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or (PGBOUNCER if os.access(PGBOUNCER, os.X_OK) else None)
    if found is None:
        pg_unavailable(f"the pooler tests need PgBouncer ({PGBOUNCER}: apt-get install pgbouncer)")
    assert found is not None
    return found


class PgBouncer:
    """``start()`` returns once it accepts connections; ``url_for(url)`` is ``url`` (a database
    of the backend) reached through it; ``stop()`` ends it and removes its files."""

    def __init__(self, backend_url: str, mode: Mode) -> None:
        self.binary = pgbouncer_binary()  # first: a missing one fails or skips the test
        backend = make_url(backend_url)
        self.mode = mode
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="ci-pgb-", dir="/tmp"))
        user = backend.username or "postgres"
        (self.root / "users.txt").write_text(f'"{user}" ""\n')
        # Every database of the backend, by the name the client asks for. The startup
        # parameters PgBouncer does not forward are ignored instead of refused (docs/operations.md,
        # "Poolers": the store's session settings).
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={backend.host or '127.0.0.1'} port={backend.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.root / 'users.txt'}\n"
            f"pool_mode = {mode}\nmax_client_conn = 200\ndefault_pool_size = 40\n"
            "ignore_startup_parameters = options,extra_float_digits\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
        )
        self._prefix: list[str] = []
        if os.geteuid() == 0:
            user = _unprivileged_user()
            entry = pwd.getpwnam(user)
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            self._prefix = drop_root_prefix(user)
        self.proc: subprocess.Popen[bytes] | None = None

    def url_for(self, url: str) -> str:
        through = make_url(url).set(host="127.0.0.1", port=self.port)
        return through.render_as_string(hide_password=False)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "pgbouncer.log").read_text(errors="replace")
        return ""

    def start(self, backend_url: str, timeout: float = 30) -> Self:
        """Start it and wait until a client gets through it to ``backend_url``'s database."""
        self.proc = subprocess.Popen(
            [*self._prefix, self.binary, str(self.root / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        conninfo = make_url(self.url_for(backend_url)).set(drivername="postgresql")
        dsn = conninfo.render_as_string(hide_password=False)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.proc.returncode}: {self.log()}")
            try:
                with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # its immediate shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
