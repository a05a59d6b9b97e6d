"""A pg_auto_failover formation for the tests: a monitor and two Postgres nodes, each run by
``pg_autoctl`` (Debian packages pg-auto-failover-cli and postgresql-15-auto-failover), all in a
temporary directory on ports of their own, as an unprivileged user when the tests run as root.
``perform_failover()`` is `pg_autoctl perform failover`: the monitor promotes the secondary
and demotes the primary, which then follows the new one."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from crossintercom.tools.pgcluster import (
    drop_root_prefix,
    existing_unprivileged_user,
    free_port,
    pg_bin,
)

READY_S = 120.0


def available() -> str | None:
    """Why a formation cannot run here, or None."""
    if shutil.which("pg_autoctl") is None:
        return "pg_autoctl not installed (Debian: pg-auto-failover-cli)"
    pg_config = pg_bin("pg_config")
    if pg_config is None:
        return "pg_config not found"
    found = subprocess.run([pg_config, "--pkglibdir"], capture_output=True, text=True, check=False)
    libdir = found.stdout
    if not (Path(libdir.strip()) / "pgautofailover.so").exists():
        return "the pgautofailover extension is not installed (postgresql-15-auto-failover)"
    if os.geteuid() == 0 and existing_unprivileged_user() is None:
        return "running as root without an unprivileged user to run Postgres as"
    return None


class Formation:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ci-paf-", dir="/tmp"))
        self.prefix: list[str] = []
        user = existing_unprivileged_user()
        if os.geteuid() == 0:
            assert user is not None
            entry = pwd.getpwnam(user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self.prefix = drop_root_prefix(user)
        pg_config = pg_bin("pg_config")
        assert pg_config is not None
        bindir = str(Path(pg_config).parent)
        self.env = {
            "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "PG_CONFIG": pg_config,
            "HOME": str(self.root),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_DATA_HOME": str(self.root / "share"),
            "XDG_RUNTIME_DIR": str(self.root / "run"),
            # The sockets in the formation's own dir: the default one may not be writable.
            "PG_REGRESS_SOCK_DIR": str(self.root),
            "PGHOST": str(self.root),
            # initdb's encoding follows the locale: UTF8, not SQL_ASCII (text read as bytes).
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }
        # The nodes' superuser (initdb's default): the user pg_autoctl runs as.
        self.user = user if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self.monitor_port = free_port()
        self.monitor = f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover"
        self.procs: list[subprocess.Popen[bytes]] = []

    def autoctl(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(
            [*self.prefix, "pg_autoctl", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pg_autoctl {args[0]} {args[1]}: {proc.stderr[-1500:]}")
        return proc.stdout

    def _run(self, name: str, *args: str) -> None:
        with open(self.root / f"{name}.log", "wb") as log:
            self.procs.append(
                subprocess.Popen(
                    [*self.prefix, "pg_autoctl", *args],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            )

    def start(self) -> Self:
        common = ("--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl")
        (self.root / "run").mkdir()
        os.chown(self.root / "run", *_owner(self.root))
        mon = str(self.root / "monitor")
        self._run("monitor", "create", "monitor", "--pgdata", mon, *common,
                  "--pgport", str(self.monitor_port), "--run")  # fmt: skip
        self.wait(self._accepts_nodes, "the monitor")
        for i, name in enumerate(("node1", "node2")):
            self._run(name, "create", "postgres", "--pgdata", str(self.root / name), *common,
                      "--pgport", str(free_port()), "--name", name,
                      "--monitor", f"{self.monitor}?sslmode=disable", "--run")  # fmt: skip
            self.wait(lambda n=i + 1: self._settled(n), f"{name} in the formation")
        return self

    def _accepts_nodes(self) -> bool:
        # Asked only once the monitor's data dir is there: pg_autoctl makes its state dirs
        # (under XDG_CONFIG_HOME) first, and a `show uri` run while the monitor makes them
        # races it, and the monitor exits ("Failed to create state directory: File exists").
        if not (self.root / "monitor" / "PG_VERSION").exists():
            return False
        try:
            self.autoctl("show", "uri", "--pgdata", str(self.root / "monitor"), timeout=10)
        except RuntimeError:
            return False
        return True

    def state(self) -> list[dict[str, Any]]:
        out = self.autoctl("show", "state", "--pgdata", str(self.root / "monitor"), "--json")
        found: list[dict[str, Any]] = json.loads(out)
        return found

    def _settled(self, nodes: int) -> bool:
        try:
            states = self.state()
        except (RuntimeError, ValueError):
            return False
        wanted = ["single"] if nodes == 1 else ["primary", "secondary"]
        reported = sorted(str(_first(s, "current_group_state", "reported_state")) for s in states)
        assigned = sorted(str(_first(s, "assigned_group_state", "assigned_state")) for s in states)
        return reported == assigned == sorted(wanted)

    def wait(self, check: Any, what: str) -> None:
        end = time.monotonic() + READY_S
        while time.monotonic() < end and all(p.poll() is None for p in self.procs):
            if check():
                return
            time.sleep(0.5)
        logs = {p.name: p.read_text(errors="replace")[-1500:] for p in self.root.glob("*.log")}
        raise RuntimeError(f"pg_auto_failover: {what} not ready (or a pg_autoctl ended): {logs}")

    def url(self, dbname: str) -> str:
        """Both nodes, as the monitor gives them (target_session_attrs=read-write)."""
        out = self.autoctl("show", "uri", "--pgdata", str(self.root / "monitor"),
                           "--formation", "default")  # fmt: skip
        uri = out.strip().split()[-1]
        hosts = uri.split("://", 1)[1].split("/", 1)[0]
        return f"postgresql://{self.user}@{hosts}/{dbname}?target_session_attrs=read-write"

    def perform_failover(self) -> None:
        self.autoctl("perform", "failover", "--pgdata", str(self.root / "monitor"), timeout=180)
        self.wait(lambda: self._settled(2), "the formation after the failover")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _owner(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid


def _first(row: dict[str, Any], *keys: str) -> object:
    """The first of ``keys`` in ``row`` (the JSON names vary across pg_autoctl versions)."""
    for key in keys:
        if key in row:
            return row[key]
    raise KeyError(f"none of {keys} in {sorted(row)}")
