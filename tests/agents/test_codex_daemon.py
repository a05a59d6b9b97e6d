"""codex_daemon.py against real processes and sockets: a Codex daemon is recognised by its
arguments, a daemon's attached clients by the connections it accepted, and the watch ends its
process's life once every watched process is gone (docs/agents.md#codex)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

from crossintercom.agents.lifetime import codex_daemon
from tests.conftest import wait_for


def _sleeper(argv0: str, *args: str) -> subprocess.Popen[bytes]:
    """A sleeping process whose argv is ``argv0 -c CODE args…`` (bash's ``exec -a``)."""
    script = 'exec -a "$0" "$1" -c "import time; time.sleep(60)" "${@:2}"'
    return subprocess.Popen(["bash", "-c", script, argv0, sys.executable, *args])


def _started(proc: subprocess.Popen[bytes]) -> bool:
    # The argv0 it was given shows only once bash has exec'd (bash's own argv holds the
    # script's words too, so they prove nothing).
    return Path(f"/proc/{proc.pid}/cmdline").read_text().startswith("/x/bin/")


def test_only_a_socket_serving_app_server_is_a_daemon() -> None:
    procs = {
        "daemon": _sleeper("/x/bin/codex", "app-server", "--listen", "unix://", "--managed-daemon"),
        "stdio": _sleeper("/x/bin/codex", "app-server"),
        "other": _sleeper("/x/bin/python", "app-server", "--listen", "unix://"),
    }
    try:
        wait_for(lambda: all(_started(p) for p in procs.values()), 10, "exec")
        assert codex_daemon.is_daemon(procs["daemon"].pid)
        assert not codex_daemon.is_daemon(procs["stdio"].pid)
        assert not codex_daemon.is_daemon(procs["other"].pid)
        assert not codex_daemon.is_daemon(None)
        # not under a daemon: nothing is watched, nothing ends
        assert codex_daemon.tie_to_tui(procs["stdio"].pid, "/", lambda: None) == []
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_clients_are_the_connections_the_listener_accepted(tmp_path: Path) -> None:
    path = str(tmp_path / "d.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        assert not codex_daemon.has_clients(os.getpid())
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            accepted, _ = listener.accept()
            with accepted:
                assert codex_daemon.has_clients(os.getpid())
        accepted.close()


def test_the_watch_ends_once_every_watched_process_is_gone() -> None:
    first, second = (
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in "ab"
    )
    ended = threading.Event()
    try:
        codex_daemon.watch([first.pid, second.pid], ended.set)
        first.kill()
        first.wait()
        assert not ended.wait(0.6)  # one is still there
        second.kill()
        second.wait()
        assert ended.wait(5)
    finally:
        for p in (first, second):
            p.kill()
            p.wait()


def test_a_tui_works_in_its_directory_or_the_one_given_with_cd(tmp_path: Path) -> None:
    """Found by executable name and where it works; a daemon or `codex exec` is no TUI."""
    codex = tmp_path / "bin" / "codex"
    codex.parent.mkdir()
    shutil.copy("/bin/bash", codex)  # an executable named codex (bash: it can wait)
    project, other = tmp_path / "project", tmp_path / "other"
    project.mkdir()
    other.mkdir()
    wait = "sleep 60; :"  # not a lone command: bash would exec it and stop being `codex`
    runs = {
        "here": ([str(codex), "-c", wait], project),
        "cd": ([str(codex), "-c", wait, "codex", "-C", "../project"], other),
        "elsewhere": ([str(codex), "-c", wait], other),
        "daemon": ([str(codex), "-c", wait, "codex", "app-server", "--listen", "unix://"], project),
    }
    procs = {k: subprocess.Popen(argv, cwd=cwd) for k, (argv, cwd) in runs.items()}
    try:
        want = {procs["here"].pid, procs["cd"].pid}
        # (bash's own fork for `sleep` is a copy of it until it execs: wait that out)
        wait_for(lambda: set(codex_daemon.clients(str(project.resolve()))) == want, 10, "TUIs")
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


DAEMON = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen()
print("ready", flush=True)
held = []
while True:
    held.append(s.accept()[0])
    print("accepted", flush=True)
"""


def test_with_no_tui_it_ends_unless_the_daemon_has_a_client(tmp_path: Path) -> None:
    """The TUI quit while the child started: no TUI works in its directory. With no client
    left on the daemon the child ends at once; with one (an IDE, the desktop app) it stays."""
    path = str(tmp_path / "d.sock")
    argv = ["bash", "-c", 'exec -a /x/bin/codex "$0" -c "$1" "$2" app-server --listen unix://']
    daemon = subprocess.Popen(
        [*argv, sys.executable, DAEMON, path], stdout=subprocess.PIPE, text=True
    )
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == "ready\n"
        assert codex_daemon.is_daemon(daemon.pid)
        ended = threading.Event()
        assert codex_daemon.tie_to_tui(daemon.pid, str(tmp_path), ended.set) == []
        assert ended.is_set()
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            assert daemon.stdout.readline() == "accepted\n"
            stays = threading.Event()
            codex_daemon.tie_to_tui(daemon.pid, str(tmp_path), stays.set)
            assert not stays.is_set()
    finally:
        daemon.kill()
        daemon.wait()
        if daemon.stdout is not None:
            daemon.stdout.close()


def test_a_process_with_no_arguments_left_works_where_it_is() -> None:
    """A process read as it exits shows an empty command line: it names no -C directory."""
    assert codex_daemon._workdir(os.getpid(), []) == os.path.realpath(os.getcwd())
