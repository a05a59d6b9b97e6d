"""`crossintercom demo`: two simulated hosts exchange messages through a shared SQLite file.

Each host is what a machine runs: its own runtime dir, host id, broker and relay process. The
store is a temporary SQLite file (the embedded default). `planner` lives on alpha, `worker` on
beta. Everything the demo started is stopped before it returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import click

from crossintercom.client import Client, Identity, wait_until
from crossintercom.config import ENV_HOME, ENV_HOST_ID, ENV_STORE, Settings, load_settings
from crossintercom.errors import CrossintercomError
from crossintercom.models import SendResult
from crossintercom.storage import migrate


class Narrator:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.t0 = time.perf_counter()

    def say(self, step: str, text: str, **data: Any) -> None:
        if self.as_json:
            click.echo(json.dumps({"step": step, "text": text, **data}))
        else:
            click.echo(f"{step:>9}  {text}")

    def outcome(self, step: str, what: str, result: SendResult, started: float) -> None:
        ms = (time.perf_counter() - started) * 1000
        self.say(
            step,
            f"{what}: {result.outcome.value} in {ms:.1f} ms",
            id=result.id,
            outcome=result.outcome.value,
            ms=round(ms, 2),
        )


def _spawn_relay(home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start a relay process; its output is appended to ``home/relay.log``."""
    with open(home / "relay.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "crossintercom.relay"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )


@dataclass
class SimHost:
    settings: Settings
    relay: subprocess.Popen[bytes]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.settings.host_id

    def restart_relay(self) -> None:
        """Start a new relay process (after the previous one was killed or exited)."""
        if self.relay.poll() is None:
            raise CrossintercomError(f"the relay for {self.name} is still running")
        self.relay = _spawn_relay(self.settings.home, self.env)


@contextlib.contextmanager
def sim_host(root: Path, host_id: str, store_url: str) -> Iterator[SimHost]:
    """A simulated machine: runtime dir, relay process (which spawns the broker)."""
    home = root / host_id
    home.mkdir(mode=0o700)
    env = {**os.environ, ENV_HOME: str(home), ENV_HOST_ID: host_id, ENV_STORE: store_url}
    settings = load_settings(env=env)
    host = SimHost(settings, _spawn_relay(home, env), env)
    try:
        yield host
    finally:
        relay = host.relay  # the current one: it may have been restarted
        relay.send_signal(signal.SIGTERM)
        try:
            relay.wait(10)
        except subprocess.TimeoutExpired:
            relay.kill()
            relay.wait()
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(settings.file("broker.pid").read_text().strip()), signal.SIGTERM)


def _relay_up(host: SimHost) -> bool:
    if host.relay.poll() is not None:
        log = (host.settings.home / "relay.log").read_text(errors="replace").strip()
        raise CrossintercomError(f"relay for {host.name} exited: {log[-500:]}")
    try:
        with Client(host.settings, None, spawn=False, reconnect=False) as c:
            return bool(c.status().relay.connected)
    except CrossintercomError:
        return False


def _sees(host: SimHost, name: str, other: str, online: bool = True) -> bool:
    with Client(host.settings, None, reconnect=False) as c:
        return any(
            s.name == name and s.host == other and s.online == online for s in c.list_sessions()
        )


def run_demo(as_json: bool = False) -> None:
    say = Narrator(as_json)
    root = Path(tempfile.mkdtemp(prefix="ci-demo-"))
    store_url = f"sqlite:///{root / 'mailbox.sqlite'}"
    try:
        migrate.upgrade(store_url)
        say.say("store", "shared mailbox: a temporary SQLite file (schema created)")
        with sim_host(root, "alpha", store_url) as alpha, sim_host(root, "beta", store_url) as beta:
            for host in (alpha, beta):
                if not wait_until(partial(_relay_up, host), 20, 0.1):
                    raise CrossintercomError(f"the relay for {host.name} did not connect")
            say.say("hosts", "alpha and beta each run a broker and a relay")
            _exchange(say, alpha, beta)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    say.say("done", "everything the demo started has stopped")


def _exchange(say: Narrator, alpha: SimHost, beta: SimHost) -> None:
    worker_id = Identity.named(beta.settings, "worker", cwd="/srv/app")
    worker = Client(beta.settings, worker_id).connect()
    planner = Client(alpha.settings, Identity.named(alpha.settings, "planner", cwd="/srv/app"))
    planner.connect()
    if not wait_until(lambda: _sees(alpha, "worker", "beta"), 20, 0.1):
        raise CrossintercomError("alpha never saw worker@beta in its roster")
    say.say(
        "list",
        "alpha sees: "
        + ", ".join(
            f"{s.display_name}@{s.host} ({'online' if s.online else 'offline'})"
            for s in planner.list_sessions()
        ),
    )

    t0 = time.perf_counter()
    sent = planner.send("worker", "Please look at the failing test in tests/test_io.py")
    say.outcome("send", "planner@alpha -> worker@beta", sent, t0)
    got = worker.next_incoming(10)
    if got is not None and got.message is not None:
        say.say("receive", f"worker saved and got: {got.message.text!r}")

    def answer() -> None:
        inc = worker.next_incoming(20)
        if inc is None or inc.message is None:
            return
        say.say("receive", f"worker got an ask: {inc.message.text!r}")
        r = worker.reply("Fixed: the fixture closed the file too early.")
        say.say("reply", f"worker replied: {r.outcome.value}")

    replier = threading.Thread(target=answer)
    replier.start()
    t0 = time.perf_counter()
    asked = planner.ask("worker", "Is the test fixed?", timeout=30)
    replier.join()
    say.outcome("ask", "planner asked worker (round trip with the reply)", asked, t0)
    say.say("answer", f"reply for planner: {asked.reply.text if asked.reply else None!r}")

    worker.close()
    say.say("offline", "worker left beta")
    t0 = time.perf_counter()
    queued = planner.send("worker", "When you are back: rebase on main.")
    say.outcome("send", "planner -> absent worker", queued, t0)
    worker = Client(beta.settings, worker_id).connect()
    back = worker.next_incoming(15)
    if back is not None and back.message is not None:
        flags = ", ".join(back.message.flags)
        say.say("resume", f"worker came back and got: {back.message.text!r} [{flags}]")
    else:
        say.say("resume", "worker came back but the queued message did not arrive in time")
    for client in (worker, planner):
        client.close()
