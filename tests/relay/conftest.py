"""Simulated hosts for the multi-host tests: each one is its own runtime dir, host id, broker and
relay process, all sharing one store (a SQLite file or a Postgres database).

Everything a test starts is stopped at teardown: relays get SIGTERM then SIGKILL, the broker
named in ``<home>/broker.pid`` and any other process whose environment names the host's home
are SIGKILLed, clients are closed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crossintercom.storage import migrate

REPO = Path(__file__).resolve().parents[2]
# Plain `pytest` (not `python -m pytest`) does not put the checkout on sys.path.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.conftest import pids_using_home  # noqa: E402
from tests.pgharness import (  # noqa: E402, F401  (fixtures are found by name)
    PgServer,
    pg_server,
    pg_template,
    pg_url,
)

CLI = [sys.executable, "-m", "crossintercom.cli.main"]
RELAY = [sys.executable, "-m", "crossintercom.relay"]


# --- polling ------------------------------------------------------------------------------------


def wait_for(predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str]) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds.

    ``what`` may be a callable, evaluated only on failure (to describe the final state)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {text}")
        time.sleep(0.05)


# --- a bare socket query to a broker (no session, no threads) ----------------------------------


def broker_query(home: Path, frame: dict[str, Any], timeout: float = 5) -> dict[str, Any] | None:
    """One request over the broker socket; None when no broker answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(home / "broker.sock"))
            body = json.dumps({**frame, "request_id": 1}).encode()
            sock.sendall(struct.pack(">I", len(body)) + body)
            while True:
                header = _exact(sock, 4)
                if header is None:
                    return None
                data = _exact(sock, struct.unpack(">I", header)[0])
                if data is None:
                    return None
                answer: dict[str, Any] = json.loads(data)
                if answer.get("request_id") == 1:
                    return answer
    except OSError:
        return None


def _exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


# --- inbox files --------------------------------------------------------------------------------


def inbox_counts(home: Path, session_id: str) -> Counter[str]:
    """How many times each message id is in a session's durable inbox file (0 if no file)."""
    path = home / "inbox" / f"{session_id}.sqlite"
    if not path.exists():
        return Counter()
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute(
            "SELECT id, COUNT(*) FROM entries WHERE kind = 'message' GROUP BY id"
        ).fetchall()
    finally:
        db.close()
    return Counter({r[0]: r[1] for r in rows})


# --- a listener subprocess ----------------------------------------------------------------------


class Listener:
    """`crossintercom listen --as NAME --json` on one host, its stdout lines collected."""

    def __init__(self, host: Host, name: str, *extra: str) -> None:
        self.host = host
        self.name = name
        self.proc = subprocess.Popen(
            [*CLI, "listen", "--as", name, "--json", *extra],
            env=host.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []  # every JSON line printed so far (pump order)
        self._stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            obj = json.loads(line)
            self.seen.append(obj)
            self._lines.put(obj)
        self._lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def wait_online(self, timeout: float = 20) -> Listener:
        def online() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"listen exited {self.proc.returncode}: {self.stderr}")
            return self.host.sees(self.name, self.host.host_id)

        wait_for(online, timeout, f"{self.name}@{self.host.host_id} to be online")
        return self

    def next_message(self, timeout: float = 20) -> dict[str, Any]:
        """The next printed object of type ``message`` (receipts and notices skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                obj = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"listener {self.name}@{self.host.host_id} printed no message in "
                    f"{timeout}s; stderr: {self.stderr}"
                ) from None
            if obj is None:
                self._lines.put(None)
                raise AssertionError(
                    f"listener {self.name} exited ({self.proc.poll()}); stderr: {self.stderr}"
                )
            if obj.get("type") == "message":
                return obj

    def message_ids(self) -> Counter[str]:
        """How many times each message id was printed."""
        return Counter(o["id"] for o in list(self.seen) if o.get("type") == "message")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for t in self._threads:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return self.proc.returncode


# --- a simulated host ---------------------------------------------------------------------------


class Host:
    """One simulated machine: its runtime dir, host id, broker and relay processes."""

    def __init__(
        self, root: Path, host_id: str, store_url: str, *, dirname: str | None = None
    ) -> None:
        self.host_id = host_id
        self.store_url = store_url
        self.home = root / (dirname or host_id)
        self.home.mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSINTERCOM_")}
        env.pop("PYTHONASYNCIODEBUG", None)
        env.update(
            CROSSINTERCOM_HOME=str(self.home),
            CROSSINTERCOM_HOST_ID=host_id,
            CROSSINTERCOM_STORE=store_url,
            PYTHONPATH=str(REPO),
        )
        self.env = env
        self.relay: subprocess.Popen[bytes] | None = None
        self._relay_runs = 0
        self.relay_logs: list[Path] = []
        self._log_of: dict[int, Path] = {}
        self._clients: list[Any] = []
        self.listeners: list[Listener] = []

    # settings are read each time: a test may write config.json after creating the host
    @property
    def settings(self) -> Any:
        from crossintercom.config import load_settings

        return load_settings(self.env)

    def configure(self, **tunables: float) -> None:
        """Write ``<home>/config.json`` (read by processes started afterwards)."""
        (self.home / "config.json").write_text(json.dumps(tunables))

    # --- relay ---------------------------------------------------------------------------------

    def spawn_relay(self) -> subprocess.Popen[bytes]:
        """Start a relay process (without waiting for it to connect)."""
        self._relay_runs += 1
        log_path = self.home.parent / f"{self.home.name}-relay-{self._relay_runs}.log"
        self.relay_logs.append(log_path)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                RELAY, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        self._log_of[proc.pid] = log_path
        return proc

    def start_relay(self, timeout: float = 30) -> Host:
        assert self.relay is None or self.relay.poll() is not None, "relay already running"
        self.relay = self.spawn_relay()
        self.wait_relay(timeout)
        return self

    def relay_log(self, proc: subprocess.Popen[bytes] | None = None) -> str:
        """What a relay process (default: the current one) wrote to stdout/stderr."""
        proc = proc or self.relay
        path = self._log_of.get(proc.pid) if proc is not None else None
        return path.read_text(errors="replace") if path is not None else ""

    def relay_connected(self) -> bool:
        status = broker_query(self.home, {"type": "status"})
        return bool(status and status.get("relay", {}).get("connected"))

    def wait_relay(self, timeout: float = 30) -> None:
        def up() -> bool:
            if self.relay is not None and self.relay.poll() is not None:
                raise AssertionError(
                    f"relay for {self.host_id} exited {self.relay.returncode}: "
                    f"{self.relay_log()[-2000:]}"
                )
            return self.relay_connected()

        wait_for(up, timeout, f"the relay of {self.host_id} to connect")

    def kill_relay(self) -> None:
        """SIGKILL the relay (a crash: no goodbye, no lock release until the process is gone)."""
        assert self.relay is not None
        self.relay.kill()
        self.relay.wait(10)

    def stop_relay(self) -> int | None:
        if self.relay is None:
            return None
        if self.relay.poll() is None:
            self.relay.send_signal(signal.SIGTERM)
            try:
                self.relay.wait(15)
            except subprocess.TimeoutExpired:
                self.relay.kill()
                self.relay.wait(5)
        return self.relay.returncode

    # --- sessions ------------------------------------------------------------------------------

    def client(self, name: str, **identity: Any) -> Any:
        """A connected ``Client`` for the durable session NAME on this host (closed at stop)."""
        from crossintercom.client import Client, Identity

        settings = self.settings
        c = Client(settings, Identity.named(settings, name, **identity))
        self._clients.append(c)
        c.connect()
        return c

    def session_id(self, name: str) -> str:
        from crossintercom.models import durable_session_id

        return durable_session_id(self.host_id, name)

    def listen(self, name: str, *extra: str, wait: bool = True) -> Listener:
        lst = Listener(self, name, *extra)
        self.listeners.append(lst)
        if wait:
            lst.wait_online()
        return lst

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """One `crossintercom` command in this host's environment; never raises on exit status."""
        return subprocess.run(
            [*CLI, *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def cli_json(self, *args: str, expect_rc: int = 0, timeout: float = 60) -> Any:
        out = self.cli(*args, "--json", timeout=timeout)
        assert out.returncode == expect_rc, (out.returncode, out.stdout, out.stderr)
        return json.loads(out.stdout)

    def sessions(self) -> list[dict[str, Any]]:
        answer = broker_query(self.home, {"type": "list"})
        return list(answer["sessions"]) if answer and "sessions" in answer else []

    def sees(self, name: str, host: str, online: bool = True) -> bool:
        return any(
            s.get("name") == name and s.get("host") == host and s.get("online") == online
            for s in self.sessions()
        )

    def wait_sees(self, name: str, host: str, online: bool = True, timeout: float = 30) -> None:
        """Wait until this host's `list` shows NAME@HOST with the given ``online`` state."""

        def what() -> str:
            seen = [(s.get("name"), s.get("host"), s.get("online")) for s in self.sessions()]
            state = "online" if online else "offline"
            return f"{self.host_id} to see {name}@{host} {state} (it sees {seen})"

        wait_for(lambda: self.sees(name, host, online), timeout, what)

    def inbox(self, name: str) -> Counter[str]:
        return inbox_counts(self.home, self.session_id(name))

    # --- teardown ------------------------------------------------------------------------------

    def begin_stop(self) -> None:
        """Ask everything to stop (SIGTERM), without waiting: hosts stop in parallel."""
        for lst in self.listeners:
            if lst.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    lst.proc.send_signal(signal.SIGTERM)
        if self.relay is not None and self.relay.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.relay.send_signal(signal.SIGCONT)  # a test may have paused it
                self.relay.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        self.begin_stop()
        for lst in self.listeners:
            with contextlib.suppress(Exception):
                lst.stop()
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()
        self.stop_relay()
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.home / "broker.pid").read_text().strip())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids_using_home(self.home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class Cluster:
    """The simulated hosts of one test, over one store."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self.root = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))
        self.hosts: list[Host] = []

    def host(
        self,
        host_id: str,
        *,
        relay: bool = True,
        dirname: str | None = None,
        **tunables: float,
    ) -> Host:
        h = Host(self.root, host_id, self.store_url, dirname=dirname)
        self.hosts.append(h)
        if tunables:
            h.configure(**tunables)
        if relay:
            h.start_relay()
        return h

    def up(self, *host_ids: str, **config: dict[str, float]) -> list[Host]:
        """Several hosts at once, relays started together; ``A={"lease_s": 2}`` configures A."""
        hosts = [self.host(h, relay=False, **config.get(h, {})) for h in host_ids]
        for h in hosts:
            h.relay = h.spawn_relay()
        for h in hosts:
            h.wait_relay()
        return hosts

    def close(self) -> None:
        for h in self.hosts:
            with contextlib.suppress(Exception):
                h.begin_stop()
        for h in self.hosts:
            with contextlib.suppress(Exception):
                h.stop()
        shutil.rmtree(self.root, ignore_errors=True)


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'mailbox.sqlite'}"
    migrate.upgrade(url)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.pg)])
def store_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_store" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def backend(store_url: str) -> str:
    return "postgres" if store_url.startswith("postgresql") else "sqlite"


@pytest.fixture
def cluster(store_url: str) -> Iterator[Cluster]:
    c = Cluster(store_url)
    try:
        yield c
    finally:
        c.close()
