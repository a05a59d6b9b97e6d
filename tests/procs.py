"""Process helpers of the tests and of the soak (tests/soak.py): clean environments for
subprocesses, waiting for a fact, a broker's pid and a broker started with a fault point, and
what an inbox or the broker's queue holds, read from their files."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crossintercom.config import ENV_HOME, load_settings
from crossintercom.inbox import Inbox
from crossintercom.local_broker.process.spawn import can_connect

REPO = Path(__file__).resolve().parents[1]
FAULTS_ENV = "CROSSINTERCOM_FAULTS"
HOST_ID = "soakhost"


def clean_env(**values: str) -> dict[str, str]:
    """This process's environment for a subprocess: no inherited CROSSINTERCOM_* variable and no
    asyncio debug mode (it slows every process down), the checkout importable, plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CROSSINTERCOM_")}
    env.pop("PYTHONASYNCIODEBUG", None)
    env["PYTHONPATH"] = str(REPO)
    env.update(values)
    return env


def make_env(home: Path, host_id: str = HOST_ID, **extra: str) -> dict[str, str]:
    """A clean environment for a subprocess on the runtime dir ``home``."""
    return clean_env(CROSSINTERCOM_HOME=str(home), CROSSINTERCOM_HOST_ID=host_id, **extra)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[:1]
        if state == ["Z"]:
            return False
    return True


# The longest pause between two polls of a cheap predicate, and of a slow one (see wait_for).
MAX_POLL_S = 0.1
MAX_SLOW_POLL_S = 0.5


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str | Callable[[], str] = "condition",
    interval: float = 0.02,
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout``.

    The pause starts at ``interval`` and grows to ``MAX_POLL_S``, and is never shorter than the
    predicate took (up to ``MAX_SLOW_POLL_S``): a wait that runs a CLI or scrapes a page each
    time would otherwise keep a core busy on a machine the other tests share (the suite is
    CPU-bound on 2 cores).
    ``what`` may be a callable, evaluated only on failure (to describe the final state)."""
    deadline = time.monotonic() + timeout
    pause = interval
    while True:
        began = time.monotonic()
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {text}")
        time.sleep(min(max(pause, now - began), MAX_SLOW_POLL_S))
        pause = min(pause * 1.5, max(MAX_POLL_S, interval))


def broker_pid(home: Path) -> int | None:
    try:
        text = (home / "broker.pid").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def live_broker_pid(home: Path) -> int | None:
    pid = broker_pid(home)
    return pid if pid is not None and pid_alive(pid) else None


def sigkill_broker(home: Path) -> int | None:
    """SIGKILL the broker named in ``home/broker.pid`` and wait until it is gone."""
    pid = live_broker_pid(home)
    if pid is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 10, f"broker {pid} to die")
    return pid


class BrokerProc:
    """A broker started by the test itself, so only it gets ``CROSSINTERCOM_FAULTS``.

    Clients started later find it on the socket and never spawn one (they inherit no fault list);
    once it has killed itself, the next client to need a broker spawns a clean one.
    """

    def __init__(self, env: dict[str, str], faults: str = "") -> None:
        self.home = Path(env["CROSSINTERCOM_HOME"])
        benv = dict(env)
        if faults:
            benv[FAULTS_ENV] = faults
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "crossintercom.local_broker"],
            env=benv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        sock = self.home / "broker.sock"

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited at start ({self.proc.returncode})")
            return can_connect(sock) and broker_pid(self.home) == self.proc.pid

        wait_for(up, 15, "the broker socket")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_dead(self, timeout: float = 15) -> int:
        """Wait for the broker to die (a fault point SIGKILLs it); returns its exit status."""
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def inbox_rows(home: Path, session_id: str) -> list[tuple[str, str, dict[str, Any], bool]]:
    """(id, kind, body, shown) of every entry in a session's inbox; [] when it has none."""
    inbox_dir = load_settings({ENV_HOME: str(home)}).inbox_dir
    with Inbox.view(inbox_dir, session_id) as inbox:
        return [(e.id, e.kind, e.body, e.shown) for e in inbox.transcript()]


def inbox_count(home: Path, session_id: str, message_id: str) -> int:
    """How many times the inbox holds message ``message_id``."""
    return sum(1 for r in inbox_rows(home, session_id) if r[1] == "message" and r[0] == message_id)


def queued_count(home: Path, kind: str = "message") -> int:
    """Items of ``kind`` (``message`` or ``receipt``) in the broker's offline queue, read from
    broker.sqlite. Receipts waiting for an away sender (a `shown` one after every message that
    was shown) are not mail, so by default they are not counted."""
    path = home / "broker.sqlite"
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        row = db.execute("SELECT count(*) FROM queue WHERE kind = ?", (kind,)).fetchone()
        return int(row[0])
    finally:
        db.close()
