"""Broker lifecycle: auto-spawn races, stale locks, SIGKILL and restart, idle exit, log, modes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    Listener,
    RawConn,
    broker_pid,
    cli_json,
    kill_broker,
    make_env,
    pid_alive,
    pids_using_home,
    run_cli,
    start_broker,
    wait_for,
)


def broker_processes(home: Path) -> list[int]:
    """Live broker processes serving ``home``."""
    out = []
    for pid in pids_using_home(home):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"crossintercom.local_broker" in cmdline and pid_alive(pid):
            out.append(pid)
    return out


# How long a few CLI processes racing to spawn one broker may take on a loaded machine: a bound for
# a hang, not an expectation (each finishes as soon as the broker answers).
_RACE_S = 120


def finish_all(procs: list[subprocess.Popen[str]]) -> list[tuple[str, str]]:
    """Every process's (stdout, stderr) once all have exited; any still running at the bound, or
    left behind by a failure, is killed and its pipes closed."""
    deadline = time.monotonic() + _RACE_S
    try:
        return [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


_PING_PID = """
import json, sys
from crossintercom.config import load_settings
from crossintercom.local_broker.process.spawn import ensure_broker
sys.path.insert(0, sys.argv[1])
from tests.conftest import RawConn
cfg = load_settings()
ensure_broker(cfg)
with RawConn(cfg.home) as c:
    print(c.request({"type": "ping"})["pid"])
"""


def test_concurrent_starts_give_one_broker(cli_env: dict[str, str], runtime_home: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PING_PID, str(REPO)],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outs = finish_all(procs)
    assert [p.returncode for p in procs] == [0] * 6, [o[1] for o in outs]
    pids = {int(o[0]) for o in outs}
    assert len(pids) == 1
    (pid,) = pids
    assert broker_pid(runtime_home) == pid
    wait_for(lambda: broker_processes(runtime_home) == [pid], 30, "losing brokers to exit")
    assert not (runtime_home / "broker.spawn.lock").exists()


def test_concurrent_cli_commands_share_one_broker(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "crossintercom.cli.main", "list", "--json"],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(5)
    ]
    outs = finish_all(procs)
    assert [p.returncode for p in procs] == [0] * 5, [o[1] for o in outs]
    assert all(json.loads(o[0]) == [] for o in outs)
    pid = broker_pid(runtime_home)
    assert pid is not None
    wait_for(lambda: broker_processes(runtime_home) == [pid], 30, "one broker")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("content", ["dead", "garbage"])
def test_stale_spawn_lock_is_recovered(
    cli_env: dict[str, str], runtime_home: Path, content: str
) -> None:
    lock = runtime_home / "broker.spawn.lock"
    # A fresh timestamp, so only the dead pid (or the unreadable content) makes it stale.
    lock.write_text(f"{dead_pid()} {time.time():.3f}\n" if content == "dead" else "x\n")
    out = run_cli(cli_env, "list", "--json", timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
    assert broker_pid(runtime_home) is not None
    assert not lock.exists()


def test_live_spawn_lock_is_respected_until_broker_answers(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    """A lock held by a live process makes others wait for its broker, not start their own."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lock = runtime_home / "broker.spawn.lock"
        lock.write_text(f"{holder.pid} {time.time():.3f}\n")
        waiter = subprocess.Popen(
            [sys.executable, "-m", "crossintercom.cli.main", "list", "--json"],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.8)
        assert waiter.poll() is None  # still waiting for the lock holder
        assert broker_processes(runtime_home) == []
        # The holder finishes (here: drops its lock without a broker); the waiter goes on.
        lock.unlink()
        out, err = waiter.communicate(timeout=20)
        assert waiter.returncode == 0, err
        assert json.loads(out) == []
    finally:
        holder.kill()
        holder.wait()


def test_sigkilled_broker_is_replaced_and_listener_reconnects(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    with Listener(cli_env, "worker") as worker:
        assert (
            cli_json(cli_env, "send", "--as", "planner", "--to", "worker", "one")["outcome"]
            == "delivered"
        )
        assert worker.messages(1)[0]["message"] == "one"
        old = kill_broker(runtime_home)
        assert old is not None
        # The next client starts a new broker; the durable worker is known there, so the
        # message is delivered (listener already back) or queued (not yet): never lost.
        sent = cli_json(cli_env, "send", "--as", "planner", "--to", "worker", "two")
        assert sent["outcome"] in ("delivered", "queued")
        (two,) = worker.messages(1, timeout=20)
        assert (two["id"], two["message"]) == (sent["id"], "two")
        new = broker_pid(runtime_home)
        assert new is not None
        assert new != old
        worker.wait_online()
        # Live again: the next message is delivered straight away.
        sent = cli_json(cli_env, "send", "--as", "planner", "--to", "worker", "three")
        assert sent["outcome"] == "delivered"
        assert worker.messages(1)[0]["message"] == "three"
        assert worker.proc.poll() is None
    transcript = cli_json(cli_env, "inbox", "--as", "worker")
    assert [m["message"] for m in transcript] == ["one", "two", "three"]


def test_listener_alone_respawns_the_broker(cli_env: dict[str, str], runtime_home: Path) -> None:
    with Listener(cli_env, "worker") as worker:
        old = kill_broker(runtime_home)
        wait_for(
            lambda: broker_pid(runtime_home) not in (None, old), 15, "listener to respawn broker"
        )
        worker.wait_online()


def write_config(home: Path, **values: float) -> None:
    (home / "config.json").write_text(json.dumps(values))


def test_idle_exit_when_nobody_ever_connects(runtime_home: Path) -> None:
    write_config(runtime_home, idle_exit_s=1)
    start_broker(make_env(runtime_home))
    pid = broker_pid(runtime_home)
    assert pid is not None
    wait_for(lambda: not pid_alive(pid), 10, "idle broker to exit")
    assert not (runtime_home / "broker.sock").exists()
    assert "idle: exiting" in (runtime_home / "broker.log").read_text()


def test_idle_exit_after_last_session_leaves(runtime_home: Path) -> None:
    write_config(runtime_home, idle_exit_s=1)
    start_broker(make_env(runtime_home))
    pid = broker_pid(runtime_home)
    assert pid is not None
    with RawConn(runtime_home) as c:
        c.register(str(uuid.uuid4()), name="stayer")
        time.sleep(1.6)
        assert c.request({"type": "ping"})["pid"] == pid  # kept alive by the session
    wait_for(lambda: not pid_alive(pid), 10, "broker to exit after the last session left")


def test_control_client_keeps_broker_alive(runtime_home: Path) -> None:
    write_config(runtime_home, idle_exit_s=1)
    start_broker(make_env(runtime_home))
    pid = broker_pid(runtime_home)
    assert pid is not None
    with RawConn(runtime_home) as relay:
        relay.register(str(uuid.uuid4()), purpose="control")
        time.sleep(1.6)
        assert pid_alive(pid)
        assert relay.request({"type": "ping"})["pid"] == pid
    wait_for(lambda: not pid_alive(pid), 10, "broker to exit after the relay left")


def test_default_idle_exit_is_five_seconds(runtime_home: Path) -> None:
    start_broker(make_env(runtime_home))
    pid = broker_pid(runtime_home)
    assert pid is not None
    time.sleep(3)
    assert pid_alive(pid)  # not before the default 5 s
    wait_for(lambda: not pid_alive(pid), 12, "broker to exit on the default idle timeout")


def test_broker_log_kept_across_spawns_and_bounded(runtime_home: Path) -> None:
    """A spawn appends (the failed start before it stays readable) and trims to the cap."""
    log_path = runtime_home / "broker.log"
    log_path.write_text("OLD-RUN-MARKER\n" * 2000 + "error: the start that failed\n")
    start_broker(make_env(runtime_home))
    wait_for(lambda: "broker ready" in log_path.read_text(), 10, "broker ready in the log")
    log = log_path.read_text()
    assert "error: the start that failed" in log
    assert log.index("the start that failed") < log.index("broker ready")
    assert log_path.stat().st_size <= 8 * 1024


def test_spawn_failure_reason_skips_logging_noise(tmp_path: Path) -> None:
    from crossintercom.local_broker.process.spawn import _tail

    log = tmp_path / "broker.log"
    log.write_text(
        "--- spawn by pid 1 at then\nerror: an older failure\n"
        "--- spawn by pid 2 at now\n--- Logging error ---\nTraceback (most recent call last):\n"
        '  File "x.py", line 1\nOSError: [Errno 24] Too many open files\n'
    )
    assert "too many open files" in _tail(log)
    assert "ulimit -n" in _tail(log)
    log.write_text("--- spawn by pid 1 at then\nerror: an older failure\n--- spawn by pid 2\n")
    assert "older failure" not in _tail(log)


def run_foreground_broker(env: dict[str, str], home: Path) -> None:
    """`crossintercom broker` in the foreground until it is ready, then SIGTERM it."""

    def readies() -> int:
        return (home / "broker.log").read_text().count("broker ready")

    before = readies()
    proc = subprocess.Popen(
        [sys.executable, "-m", "crossintercom.cli.main", "broker"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: readies() > before, 15, "broker ready")
        proc.terminate()
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_broker_log_capped_at_8_kib(runtime_home: Path) -> None:
    """The broker itself keeps its log under 8 KiB (a foreground broker does not truncate)."""
    env = make_env(runtime_home)
    log_path = runtime_home / "broker.log"
    log_path.write_text("".join(f"old line {i:05d} {'x' * 80}\n" for i in range(1000)))
    assert log_path.stat().st_size > 90_000
    for _ in range(3):
        run_foreground_broker(env, runtime_home)
        assert log_path.stat().st_size <= 8192
    log = log_path.read_text()
    assert "log truncated" in log
    assert log.count("broker ready") == 3
    assert log.count("broker stopped") == 3
    assert "old line 00000" not in log  # the oldest lines went, the newest stayed


def test_log_handler_stays_under_cap_with_many_lines(tmp_path: Path) -> None:
    import logging

    from crossintercom.local_broker.process.logcap import CappedFileHandler

    path = tmp_path / "broker.log"
    handler = CappedFileHandler(path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for i in range(3000):
        handler.emit(logging.makeLogRecord({"msg": f"line {i:05d} " + "y" * (i % 150)}))
        assert path.stat().st_size <= 8192
    text = path.read_text()
    assert text.splitlines()[-1].startswith("line 02999 ")
    assert "line 00000 " not in text
    # Every kept line is whole: the cut is made at a line boundary.
    assert all(ln.startswith(("line ", "[log truncated")) for ln in text.splitlines())
    handler.close()
