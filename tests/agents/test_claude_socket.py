"""`wait --format claude-socket` against a stand-in for Claude Code's messaging socket (a real
Unix socket in the test): the hook returns at once, its detached child writes the auth line and
the framed mail, marks it shown only after, ends with the process named in CLAUDE_PID, and when
the socket refuses it ends with the mail left unseen for the Stop hook. The real binary runs it
in tests/harnesses/test_claude_socket.py."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import pids_using_home, run_cli, wait_for

TOKEN = "t0ken"


class FakeSocket:
    """Takes connections as Claude Code 2.1.332 does (reads lines, closes after the user line);
    with ``refuse`` it resets each connection instead."""

    def __init__(self, path: Path, *, refuse: bool = False) -> None:
        self.path, self.refuse = path, refuse
        self.lines: list[dict[str, object]] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                if self.refuse:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    continue
                buf = b""
                while chunk := conn.recv(4096):
                    buf += chunk
                    if buf.count(b"\n") >= 2:
                        break
                self.lines += [json.loads(line) for line in buf.splitlines()]

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def harness() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for Claude Code (its pid is CLAUDE_PID)."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


def socket_children(home: Path) -> list[int]:
    found = []
    for pid in pids_using_home(home):
        with contextlib.suppress(OSError):  # gone meanwhile
            if b"claude-socket" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def start_hook(env: dict[str, str], path: Path, harness: int) -> dict[str, str]:
    for name in ("w", "peer"):
        assert run_cli(env, "wait", "--as", name, "--timeout", "0").returncode == 6
    hook_env = {
        **env,
        "CLAUDE_CODE_MESSAGING_SOCKET": str(path),
        "CLAUDE_CODE_MESSAGING_TOKEN": TOKEN,
        "CLAUDE_PID": str(harness),
    }
    started = time.monotonic()
    out = run_cli(hook_env, "wait", "--as", "w", "--format", "claude-socket")
    assert out.returncode == 0 and not out.stdout, out
    assert time.monotonic() - started < 20  # returns at once, leaving the child
    wait_for(lambda: socket_children(Path(env["CROSSINTERCOM_HOME"])), 20, "the child")
    return hook_env


def unseen(env: dict[str, str]) -> list[dict[str, object]]:
    out = run_cli(env, "wait", "--as", "w", "--format", "json", "--timeout", "0")
    assert out.returncode in (0, 6), out
    return list(json.loads(out.stdout))


def test_child_delivers_framed_marks_shown_and_ends_with_its_harness(
    cli_env: dict[str, str], tmp_path: Path, harness: subprocess.Popen[bytes]
) -> None:
    fake = FakeSocket(tmp_path / "cc.sock")
    try:
        start_hook(cli_env, fake.path, harness.pid)
        token = uuid.uuid4().hex
        assert run_cli(cli_env, "send", "--as", "peer", "--to", "w", token).returncode == 0
        wait_for(lambda: len(fake.lines) >= 2, 30, "the delivery")
        auth, user = fake.lines[:2]
        assert auth == {"type": "auth", "token": TOKEN}
        assert user["type"] == "user"
        content = json.dumps(user["message"])
        assert token in content and "<<<crossintercom message from peer@" in content
        assert unseen(cli_env) == []  # shown, by the socket
        harness.kill()
        home = Path(cli_env["CROSSINTERCOM_HOME"])
        wait_for(lambda: not socket_children(home), 10, "the child ending with its harness")
    finally:
        fake.close()


def test_a_refusing_socket_leaves_the_mail_for_the_stop_hook(
    cli_env: dict[str, str], tmp_path: Path, harness: subprocess.Popen[bytes]
) -> None:
    fake = FakeSocket(tmp_path / "cc.sock", refuse=True)
    try:
        start_hook(cli_env, fake.path, harness.pid)
        token = uuid.uuid4().hex
        assert run_cli(cli_env, "send", "--as", "peer", "--to", "w", token).returncode == 0
        home = Path(cli_env["CROSSINTERCOM_HOME"])
        wait_for(lambda: not socket_children(home), 30, "the child giving up")
        assert [m["message"] for m in unseen(cli_env)] == [token]
    finally:
        fake.close()


def test_no_socket_or_no_harness_pid_starts_nothing(
    cli_env: dict[str, str], tmp_path: Path, harness: subprocess.Popen[bytes]
) -> None:
    fake = FakeSocket(tmp_path / "cc.sock")
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    try:
        for extra in (
            {},  # outside Claude Code
            {"CLAUDE_CODE_MESSAGING_SOCKET": str(fake.path), "CLAUDE_CODE_MESSAGING_TOKEN": "t"},
            {  # the socket is gone
                "CLAUDE_CODE_MESSAGING_SOCKET": str(tmp_path / "gone.sock"),
                "CLAUDE_CODE_MESSAGING_TOKEN": "t",
                "CLAUDE_PID": str(harness.pid),
            },
        ):
            out = run_cli({**cli_env, **extra}, "wait", "--as", "w", "--format", "claude-socket")
            assert out.returncode == 0, out
            assert not socket_children(home)
    finally:
        fake.close()
