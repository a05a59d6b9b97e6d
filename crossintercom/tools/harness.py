"""Simulated hosts over one shared store, for `crossintercom demo|bench|chaos` and the tests.

A simulated host is what a machine runs: its own runtime dir (``CROSSINTERCOM_HOME``) and host id
(``CROSSINTERCOM_HOST_ID``), a relay process (which spawns the host's broker on connecting) and
any listener processes. Each relay run logs to its own file beside the host's runtime dir, so a
caller can read what one particular relay said. ``Cluster`` starts the relays of several hosts
together and stops everything they started, in parallel. A host's broker is asked through the
public ``Client`` API (no session, no spawning) and its inboxes are read through ``Inbox``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

from crossintercom.client import Client, Identity, wait_until
from crossintercom.config import ENV_HOME, ENV_HOST_ID, ENV_STORE, Settings, load_settings
from crossintercom.errors import CrossintercomError
from crossintercom.inbox import Inbox
from crossintercom.models import SessionInfo, durable_session_id

CLI = [sys.executable, "-m", "crossintercom"]
# Bulk senders (the benchmark, chaos) are not agents in a loop: the per-sender rate limit is
# lifted for their hosts (docs/agents.md#policy).
BULK_SENDER: dict[str, float] = {"rate_limit_count": 1_000_000_000}
RELAY = [sys.executable, "-m", "crossintercom.relay"]
_POLL_S = 0.05
# How long a relay may take to connect: the wait ends as soon as it has, and the bound is generous
# because on a loaded machine a relay (and the broker it spawns) can take well over 30 s to start.
RELAY_CONNECT_S = 120.0
T = TypeVar("T")


def _until(predicate: Callable[[], bool], timeout: float, failure: Callable[[], str]) -> None:
    if not wait_until(predicate, timeout, _POLL_S):
        raise CrossintercomError(failure())


# --- what a host's broker says (no session, no spawning) ---------------------------------------


def _query(settings: Settings, ask: Callable[[Client], T]) -> T:
    with Client(settings, None, spawn=False, reconnect=False) as client:
        return ask(client)


def broker_sessions(settings: Settings) -> list[SessionInfo]:
    """The sessions the broker of ``settings`` lists (none while no broker answers)."""
    try:
        return _query(settings, Client.list_sessions)
    except CrossintercomError:
        return []


def sees(settings: Settings, name: str, host: str, *, online: bool = True) -> bool:
    """True when the broker of ``settings`` lists NAME@HOST in the given ``online`` state."""
    return any(
        s.name == name and s.host == host and s.online == online for s in broker_sessions(settings)
    )


def relay_connected(settings: Settings) -> bool:
    try:
        return _query(settings, Client.status).relay.connected
    except CrossintercomError:
        return False


# --- processes ----------------------------------------------------------------------------------


def _end(proc: subprocess.Popen[Any], timeout: float) -> int:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; returns the exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


class ListenerProcess:
    """`crossintercom listen --as NAME [extra...]` in the background, in one host's environment.

    With ``log`` its stdout is dropped and its stderr appended to that file; without, stdout and
    stderr are text pipes for the caller to read.
    """

    def __init__(
        self, env: Mapping[str, str], name: str, *extra: str, log: Path | None = None
    ) -> None:
        self.env = dict(env)
        self.name = name
        self.extra = extra
        self.log = log
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[str]:
        cmd = [*CLI, "listen", "--as", self.name, *self.extra]
        with contextlib.ExitStack() as files:
            out: Any = subprocess.PIPE
            err: Any = subprocess.PIPE
            if self.log is not None:
                out, err = subprocess.DEVNULL, files.enter_context(open(self.log, "a"))
            return subprocess.Popen(
                cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def restart(self) -> None:
        """A new process for the same session, after the previous one exited or was killed."""
        if self.alive():
            raise CrossintercomError(f"the listener {self.name} is still running")
        self.proc = self._spawn()

    def kill(self) -> None:
        """SIGKILL (a crash: nothing is flushed or said goodbye to)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait()

    def terminate(self) -> None:
        """Ask it to stop without waiting, so that several can stop in parallel."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        return _end(self.proc, 10)


# --- a simulated host ---------------------------------------------------------------------------


class SimHost:
    """One simulated machine: runtime dir, host id, relay (and so broker) and listeners.

    ``base_env`` is the environment its processes start from (default: this process's).
    """

    # How the broker is ended at ``stop``: SIGTERM lets it finish its own shutdown.
    broker_stop_signal = signal.SIGTERM

    def __init__(
        self,
        root: Path,
        host_id: str,
        store_url: str,
        *,
        dirname: str | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.host_id = host_id
        self.store_url = store_url
        self.home = root / (dirname or host_id)
        self.home.mkdir(mode=0o700)
        base = os.environ if base_env is None else base_env
        self.env = {**base, ENV_HOME: str(self.home), ENV_HOST_ID: host_id, ENV_STORE: store_url}
        self.relay: subprocess.Popen[bytes] | None = None
        self.listeners: list[ListenerProcess] = []
        self._relay_runs = 0
        self._log_of: dict[int, Path] = {}
        self._clients: list[Client] = []

    @property
    def settings(self) -> Settings:
        # Read each time: config.json may be written after the host was made.
        return load_settings(self.env)

    def configure(self, **tunables: float) -> None:
        """Write ``<home>/config.json`` (read by processes started afterwards)."""
        (self.home / "config.json").write_text(json.dumps(tunables))

    # --- relay ---------------------------------------------------------------------------------

    def spawn_relay(self) -> subprocess.Popen[bytes]:
        """Start a relay process, without waiting for it and without making it ``self.relay``."""
        self._relay_runs += 1
        log_path = self.home.parent / f"{self.home.name}-relay-{self._relay_runs}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                RELAY, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        self._log_of[proc.pid] = log_path
        return proc

    def start_relay(self, *, wait: bool = True, timeout: float = RELAY_CONNECT_S) -> Self:
        """Start the host's relay (the previous one must be gone); by default until it connects."""
        if self.relay is not None and self.relay.poll() is None:
            raise CrossintercomError(f"the relay for {self.host_id} is still running")
        self.relay = self.spawn_relay()
        if wait:
            self.wait_relay(timeout)
        return self

    def relay_log(self, proc: subprocess.Popen[bytes] | None = None) -> str:
        """What a relay process (default: the current one) wrote to stdout/stderr."""
        proc = proc or self.relay
        path = self._log_of.get(proc.pid) if proc is not None else None
        return path.read_text(errors="replace") if path is not None else ""

    def relay_connected(self) -> bool:
        return relay_connected(self.settings)

    def wait_relay(self, timeout: float = RELAY_CONNECT_S) -> None:
        def up() -> bool:
            if self.relay is not None and self.relay.poll() is not None:
                raise CrossintercomError(
                    f"the relay for {self.host_id} exited {self.relay.returncode}: "
                    f"{self.relay_log()[-2000:]}"
                )
            return self.relay_connected()

        _until(up, timeout, lambda: f"the relay for {self.host_id} did not connect in {timeout} s")

    def kill_relay(self) -> None:
        """SIGKILL the relay (a crash: no goodbye, no lock release until the process is gone)."""
        if self.relay is not None and self.relay.poll() is None:
            self.relay.kill()
            self.relay.wait(10)

    def stop_relay(self) -> int | None:
        if self.relay is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            self.relay.send_signal(signal.SIGCONT)  # it may have been paused
        return _end(self.relay, 15)

    # --- broker --------------------------------------------------------------------------------

    def broker_pid(self) -> int | None:
        try:
            return int(self.settings.file("broker.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def kill_broker(self, sig: int = signal.SIGKILL) -> bool:
        """Signal the host's broker (default SIGKILL); False when there is none to signal."""
        pid = self.broker_pid()
        if pid is None:
            return False
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    # --- sessions ------------------------------------------------------------------------------

    def session_id(self, name: str) -> str:
        return durable_session_id(self.host_id, name)

    def identity(self, name: str, **identity: Any) -> Identity:
        """The durable session NAME on this host."""
        return Identity.named(self.settings, name, **identity)

    def client(self, name: str, **identity: Any) -> Client:
        """A connected ``Client`` for the durable session NAME (closed at ``stop``)."""
        c = Client(self.settings, self.identity(name, **identity))
        self._clients.append(c)
        return c.connect()

    def listen(self, name: str, *extra: str) -> ListenerProcess:
        """`crossintercom listen --as NAME` here (stopped at ``stop``); stderr to a log file."""
        listener = ListenerProcess(
            self.env, name, *extra, log=self.home.parent / f"{self.home.name}-listen-{name}.log"
        )
        self.listeners.append(listener)
        return listener

    def sessions(self) -> list[SessionInfo]:
        return broker_sessions(self.settings)

    def sees(self, name: str, host: str, online: bool = True) -> bool:
        return sees(self.settings, name, host, online=online)

    def wait_sees(self, name: str, host: str, online: bool = True, timeout: float = 30) -> None:
        """Wait until this host's `list` shows NAME@HOST in the given ``online`` state."""

        def failure() -> str:
            seen = [(s.name, s.host, s.online) for s in self.sessions()]
            state = "online" if online else "offline"
            return f"{self.host_id} never saw {name}@{host} {state} (it sees {seen})"

        _until(lambda: self.sees(name, host, online), timeout, failure)

    def open_inbox(self, name: str) -> Inbox:
        """A read-only view of the durable session NAME's inbox (empty while it has none)."""
        return Inbox.view(self.settings.inbox_dir, self.session_id(name))

    # --- teardown ------------------------------------------------------------------------------

    def begin_stop(self) -> None:
        """Ask listeners and relay to stop (SIGTERM), without waiting: hosts stop in parallel."""
        for listener in self.listeners:
            listener.terminate()
        if self.relay is not None and self.relay.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.relay.send_signal(signal.SIGCONT)
                self.relay.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """Stop everything this host started: listeners, clients, relay, broker."""
        self.begin_stop()
        for listener in self.listeners:
            with contextlib.suppress(Exception):
                listener.stop()
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()
        self.stop_relay()
        self.kill_broker(self.broker_stop_signal)


H = TypeVar("H", bound=SimHost)


class Cluster(Generic[H]):
    """The simulated hosts of one run, over one store, under one root directory."""

    def __init__(
        self,
        root: Path,
        store_url: str,
        host_class: type[H],
        *,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.store_url = store_url
        self.hosts: list[H] = []
        self._host_class = host_class
        self._base_env = base_env

    def host(
        self, host_id: str, *, relay: bool = True, dirname: str | None = None, **tunables: float
    ) -> H:
        """One more host; its relay started (and connected) unless ``relay=False``."""
        h = self._host_class(
            self.root, host_id, self.store_url, dirname=dirname, base_env=self._base_env
        )
        self.hosts.append(h)
        if tunables:
            h.configure(**tunables)
        if relay:
            h.start_relay()
        return h

    def up(self, *host_ids: str, **config: dict[str, float]) -> list[H]:
        """Several hosts at once, relays started together; ``A={"lease_s": 2}`` configures A."""
        hosts = [self.host(h, relay=False) for h in host_ids]
        for h in hosts:
            if h.host_id in config:
                h.configure(**config[h.host_id])
        for h in hosts:
            h.start_relay(wait=False)
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
