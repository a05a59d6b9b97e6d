"""Fixtures every test can use: a short runtime dir, a subprocess environment, CLI helpers, and
the one ``Listener`` helper (a `crossintercom listen` process whose output the test reads).

Every process a test starts runs with ``CROSSINTERCOM_HOME`` set to that test's own runtime dir,
so teardown finds and SIGKILLs exactly those (the broker, listeners, one-shot commands) by pid and
no test leaks processes into the next.
"""

from __future__ import annotations

import compileall
import contextlib
import gc
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
# Plain `pytest` (not `python -m pytest`) does not put the checkout on sys.path.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from crossintercom.client import wait_until  # noqa: E402
from crossintercom.client.sync import CLIENT_THREAD  # noqa: E402
from crossintercom.tools.harness import CLI, ListenerProcess, sees  # noqa: E402

# The process helpers live in tests/procs.py, which the soak (tests/soak.py) runs without pytest.
from tests.procs import broker_pid, pid_alive, wait_for  # noqa: E402
from tests.procs import make_env as _make_env  # noqa: E402
from tests.rawconn import RawConn, sessions  # noqa: E402

# Imported names the tests take from here (for mypy, imports are re-exported only when listed).
__all__ = ["CLI", "RawConn", "broker_pid", "pid_alive", "sessions", "wait_for"]

# pytest imports this file as `conftest`; tests import helpers as `tests.conftest`. One module,
# so the listener registry below is shared.
sys.modules.setdefault("tests.conftest", sys.modules[__name__])

HOST_ID = "testhost"
# AF_UNIX sun_path holds 108 bytes including the NUL.
MAX_SOCKET_PATH = 107


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the package once, before any test starts a process. Where
    ``PYTHONDONTWRITEBYTECODE`` is set (CI machines set it) an editable checkout never gets its
    ``.pyc`` files, and each of the suite's thousands of process starts (every CLI call, broker,
    relay, listener) would compile the package's modules again: about 0.1 s of CPU per CLI call
    and 0.3 s per relay (docs/performance.md, "Byte code")."""
    if not hasattr(config, "workerinput"):  # the controller only, not each xdist worker
        compileall.compile_dir(REPO / "crossintercom", quiet=1)


# --- tiers (CONTRIBUTING.md, "Test tiers") ------------------------------------------------------

TESTS = Path(__file__).resolve().parent
# End to end: the real harness binaries, the overseer page in Chromium (any test using the
# ``browser`` fixture), and the whole-system runs: failover, chaos and bench, soaks.
E2E_DIRS = {"harnesses"}
E2E_FILES = {
    "test_bench_chaos.py",
    "broker/test_soak.py",
    "relay/test_bounds_soak.py",
    "relay/test_failover.py",
    "relay/test_pg_auto_failover.py",
    "relay/test_shared_fs_chaos.py",
    "test_bench_polling.py",
    "storage/test_failover_wakeup.py",
}
E2E_FIXTURES = {"browser"}


def tier_of(item: pytest.Item) -> str:
    """``unit`` for tests/unit (in process, checked by tests/unit/conftest.py), ``e2e`` for the
    whole-system tests above, ``integration`` for the rest (real stores, real processes)."""
    path = Path(str(item.fspath)).resolve().relative_to(TESTS)
    if path.parts[0] == "unit":
        return "unit"
    if (
        path.parts[0] in E2E_DIRS
        or path.as_posix() in E2E_FILES
        or E2E_FIXTURES & set(getattr(item, "fixturenames", ()))
    ):
        return "e2e"
    return "integration"


def _start_rank(item: pytest.Item, tier: str) -> int:
    if tier == "e2e":
        return (
            0 if Path(str(item.fspath)).resolve().relative_to(TESTS).as_posix() in E2E_FILES else 1
        )
    return 2 if tier == "integration" else 3


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with its tier, so ``-m unit``, ``-m integration`` and ``-m e2e`` select,
    and runs the longest first: the whole-system runs, the rest of end to end, integration, and
    the unit tier last. Workers handed tests as they free up (``--dist load``, as .ci/run runs)
    then start the long ones at once and end on short ones, instead of one worker starting a
    minutes-long test while the others have run out (the stable sort keeps each file's order)."""
    ranks = {}
    for item in items:
        tier = tier_of(item)
        item.add_marker(tier)
        ranks[item.nodeid] = _start_rank(item, tier)
    items.sort(key=lambda item: ranks[item.nodeid])


# --- processes --------------------------------------------------------------------------------


def _environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def pids_using_home(home: Path) -> list[int]:
    """Processes (other than this one) whose CROSSINTERCOM_HOME is ``home`` or a dir inside it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        used = _environ_of(int(entry.name)).get("CROSSINTERCOM_HOME")
        if used is not None and (used == str(home) or used.startswith(f"{home}/")):
            found.append(int(entry.name))
    return found


def kill_broker(home: Path) -> int | None:
    """SIGKILL the broker whose pid is in ``home/broker.pid``; returns that pid (or None)."""
    pid = broker_pid(home)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 5, f"broker {pid} to die")
    return pid


# --- runtime dir and environment ----------------------------------------------------------------


@pytest.fixture
def runtime_home() -> Iterator[Path]:
    """A fresh, short runtime dir under /tmp; every process using it is killed at teardown."""
    home = Path(tempfile.mkdtemp(prefix="ci-", dir="/tmp"))
    assert len(os.fsencode(home / "broker.sock")) <= MAX_SOCKET_PATH
    try:
        yield home
    finally:
        kill_broker(home)
        for pid in pids_using_home(home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


def make_env(home: Path, host_id: str = HOST_ID, **extra: str) -> dict[str, str]:
    """A clean environment for a subprocess on ``home`` (nothing CROSSINTERCOM_* inherited)."""
    return _make_env(home, host_id, **extra)


@pytest.fixture
def cli_env(runtime_home: Path) -> dict[str, str]:
    """Environment for subprocesses: this test's runtime dir and host id, nothing inherited."""
    return make_env(runtime_home)


def settings_for(env: dict[str, str], **overrides: Any) -> Any:
    from crossintercom.config import load_settings

    return load_settings(env, **overrides)


def start_broker(env: dict[str, str]) -> Any:
    """Spawn (or find) the broker for ``env``; returns its Settings."""
    from crossintercom.local_broker.process.spawn import ensure_broker

    cfg = settings_for(env)
    ensure_broker(cfg)
    return cfg


# --- the CLI as a subprocess --------------------------------------------------------------------


def run_cli(
    env: dict[str, str], *args: str, input: str | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run one `crossintercom` command the way a script would; never raises on exit status."""
    return subprocess.run(
        [*CLI, *args],
        env=env,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_cli(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """One `crossintercom` command in the background (an `ask` waiting for its reply), its
    output piped for the test to read."""
    return subprocess.Popen(
        [*CLI, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def background_cli(env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    """``start_cli`` for the length of a block: killed if the block (a failed assertion
    included) leaves it running, and reaped with its pipes closed either way (one that ended
    by itself would leave them to the garbage collector, a ResourceWarning)."""
    proc = start_cli(env, *args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


# The keys of a message object as `--json` prints it (docs/protocol.md).
MESSAGE_KEYS = {
    "type",
    "id",
    "from",
    "to",
    "message",
    "attachments",
    "reply_to",
    "expects_reply",
    "sent_at",
    "flags",
    "subject",
    "thread_id",
    "priority",
    "ack_required",
    "ack_by",
}


def cli_json(env: dict[str, str], *args: str, expect_rc: int = 0, **kw: Any) -> Any:
    """Run a command with --json, check its exit code and return the parsed stdout."""
    out = run_cli(env, *args, "--json", **kw)
    assert out.returncode == expect_rc, (out.returncode, out.stdout, out.stderr)
    return json.loads(out.stdout)


def _client_threads() -> int:
    return sum(t.name == CLIENT_THREAD for t in threading.enumerate())


@pytest.fixture(autouse=True)
def _no_client_left_running() -> Iterator[None]:
    """Fails a test that leaves a blocking ``Client``'s loop thread running after its teardown:
    a Client kept referenced and never closed (one merely dropped ends when collected)."""
    before = _client_threads()
    yield
    if _client_threads() > before:
        gc.collect()
        if not wait_until(lambda: _client_threads() <= before, 10):
            pytest.fail(f"{_client_threads() - before} Client loop thread(s) left running")


_LISTENERS: list[Listener] = []


@pytest.fixture(autouse=True)
def _stop_listeners() -> Iterator[None]:
    yield
    while _LISTENERS:
        _LISTENERS.pop().stop()


class Listener(ListenerProcess):
    """`crossintercom listen --as NAME --json [extra...]` in the background, its output collected.

    Every JSON object it prints is kept in ``seen`` (in order) and queued for ``messages`` and
    ``next_message``. Stopped at the end of the test at the latest.
    """

    def __init__(
        self, env: dict[str, str], name: str, *extra: str, wait: bool = True, timeout: float = 20
    ) -> None:
        super().__init__(env, name, "--json", *extra)
        self.home = Path(env["CROSSINTERCOM_HOME"])
        _LISTENERS.append(self)
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()
        if wait:
            self.wait_online(timeout)

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
        settings = settings_for(self.env)

        def online() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"listen exited {self.proc.returncode}: {self.stderr}")
            return sees(settings, self.name, settings.host_id)

        wait_for(online, timeout, f"listener {self.name}@{settings.host_id} to be online")
        return self

    def _next(self, deadline: float, what: str) -> dict[str, Any]:
        try:
            obj = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"listener {self.name}: {what}; stderr: {self.stderr}") from None
        if obj is None:
            self._lines.put(None)
            raise AssertionError(
                f"listener {self.name} exited ({self.proc.poll()}): {what}; stderr: {self.stderr}"
            )
        return obj

    def messages(self, n: int, timeout: float = 10) -> list[dict[str, Any]]:
        """The next ``n`` JSON objects the listener printed (fails after ``timeout``)."""
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            out.append(self._next(deadline, f"got {len(out)} of {n} lines"))
        return out

    def next_message(self, timeout: float = 20) -> dict[str, Any]:
        """The next printed object of type ``message`` (receipts and notices skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            obj = self._next(deadline, f"printed no message in {timeout}s")
            if obj.get("type") == "message":
                return obj

    def message_ids(self) -> Counter[str]:
        """How many times each message id was printed."""
        return Counter(o["id"] for o in list(self.seen) if o.get("type") == "message")

    def no_message(self, wait: float = 0.5) -> None:
        """Assert nothing more is printed within ``wait`` seconds."""
        try:
            line = self._lines.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"listener {self.name} printed unexpectedly: {line!r}")

    def stop(self) -> int:
        code = super().stop()
        for t in self._threads:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return code

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
