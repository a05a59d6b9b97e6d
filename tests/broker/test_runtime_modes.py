"""The runtime dir's modes (docs/operations.md, "Files in the runtime dir"): what the broker
and the CLI create, and what they tighten when they find it looser, before any client counts
the broker up."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import Listener, cli_json, make_env, run_cli


def all_entries(home: Path) -> list[Path]:
    return [home, *sorted(home.rglob("*"))]


def test_default_modes(cli_env: dict[str, str], runtime_home: Path) -> None:
    with Listener(cli_env, "worker") as worker:
        assert cli_json(cli_env, "send", "--to", "worker", "hi")["outcome"] == "delivered"
        worker.messages(1)
        checked = set()
        for path in all_entries(runtime_home):
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                assert mode == 0o700, path
            else:
                assert mode == 0o600, (path, oct(mode))
            checked.add(path.name)
        assert stat.S_ISSOCK((runtime_home / "broker.sock").lstat().st_mode)
        assert {"broker.sock", "broker.pid", "broker.log", "inbox"} <= checked


def test_modes_are_set_before_the_socket_listens(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    """A client counts the broker up once a connect succeeds (``ensure_broker``), and a mode
    changed after that is the caller's: so the broker sets its modes before it listens, not
    after (a chmod made right after the broker came up was once undone under load)."""
    stray = runtime_home / "stray"
    stray.write_text("")
    stray.chmod(0o644)
    broker = subprocess.Popen(
        [sys.executable, "-m", "crossintercom.local_broker"],
        env=cli_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # as often as it can: the first connect that succeeds
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(runtime_home / "broker.sock"))
                break
            except OSError:
                assert broker.poll() is None and time.monotonic() < deadline, "no broker"
            finally:
                probe.close()
        assert stat.S_IMODE(stray.stat().st_mode) == 0o600
    finally:
        broker.terminate()
        broker.wait(timeout=30)


def test_loose_runtime_dir_is_tightened(cli_env: dict[str, str], runtime_home: Path) -> None:
    runtime_home.chmod(0o755)
    out = run_cli(cli_env, "list", "--json")
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(runtime_home.stat().st_mode) == 0o700
    assert "tightened" in out.stderr  # and logged


def test_loose_inbox_files_are_tightened(cli_env: dict[str, str], runtime_home: Path) -> None:
    # The broker stays up between the sends: a restarted one re-modes the inbox files itself
    # (logged in broker.log), before the client could.
    (runtime_home / "config.json").write_text(json.dumps({"idle_exit_s": 600}))
    assert cli_json(cli_env, "send", "--as", "me", "--to", "me", "hi")["outcome"] == "delivered"
    files = sorted((runtime_home / "inbox").iterdir())
    assert files
    for f in files:
        f.chmod(0o644)
    out = run_cli(cli_env, "send", "--as", "me", "--to", "me", "again")
    assert out.returncode == 0, out.stderr
    for f in sorted((runtime_home / "inbox").iterdir()):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert "inbox file mode tightened" in out.stderr


def test_loose_broker_files_are_tightened(cli_env: dict[str, str], runtime_home: Path) -> None:
    for name in ("broker.log", "broker.pid", "broker.sqlite"):
        (runtime_home / name).touch(mode=0o644)
        (runtime_home / name).chmod(0o644)
    assert run_cli(cli_env, "list", "--json").returncode == 0
    for name in ("broker.log", "broker.pid", "broker.sqlite"):
        assert stat.S_IMODE((runtime_home / name).stat().st_mode) == 0o600, name


def test_group_modes(runtime_home: Path) -> None:
    home = runtime_home / "shared"
    env = make_env(home, CROSSINTERCOM_GROUP="daemon")
    assert cli_json(env, "send", "--as", "me", "--to", "me", "hi")["outcome"] == "delivered"
    import grp

    gid = grp.getgrnam("daemon").gr_gid
    for path in all_entries(home):
        st = path.lstat()
        mode = stat.S_IMODE(st.st_mode)
        # sticky directories: no member renames or deletes another's files
        assert mode == (0o1770 if stat.S_ISDIR(st.st_mode) else 0o660), (path, oct(mode))
        assert st.st_gid == gid, path
