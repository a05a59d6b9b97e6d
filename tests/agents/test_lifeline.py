"""The lifeline (docs/agents.md#lifeline): `wait`, `mcp` and `listen --format line`, started by a
harness directly or through a shell that does not exec, end within seconds of the harness
ending, however it ends; the MCP server also ends when its stdin closes.

The harness here is a small Python process that starts the three children the way harnesses
do (the hook through ``sh -c "...; true"``, so a shell stays between), prints their pids, and
ends by the test's choice. Every child is a real `crossintercom` on a real broker.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, start_broker
from tests.procs import wait_for

HARNESS = r"""
import json, os, signal, subprocess, sys, time
cli, mode = json.loads(sys.argv[1]), sys.argv[2]
hook = subprocess.Popen(["sh", "-c", " ".join(cli) + " wait --as hw --format claude-hook "
                         "--timeout 600 </dev/null; true"])
mcp = subprocess.Popen([*cli, "mcp", "--as", "hm"], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE)
mon = subprocess.Popen([*cli, "listen", "--as", "hl", "--format", "line"],
                       stdout=subprocess.PIPE)
print(json.dumps([hook.pid, mcp.pid, mon.pid]), flush=True)
sys.stdin.readline()
if mode == "term":
    os.kill(os.getpid(), signal.SIGTERM)
if mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
os._exit(0)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _has_lifeline(pid: int) -> bool:
    """The process set its lifeline up (it catches the parent-death signal, SIGUSR2)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(x for x in status.splitlines() if x.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (signal.SIGUSR2 - 1)))


def _reap(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _children_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def _crossintercom_pids(cli_env: dict[str, str]) -> list[int]:
    """Processes running with this test's runtime dir (the broker excepted)."""
    home = cli_env["CROSSINTERCOM_HOME"]
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if f"CROSSINTERCOM_HOME={home}".encode() in env and b"broker" not in cmd:
            found.append(int(d.name))
    return [p for p in found if _alive(p)]


@pytest.mark.parametrize("how", ["normal", "term", "kill"])
def test_children_end_with_their_harness(cli_env: dict[str, str], how: str) -> None:
    start_broker(cli_env)
    harness = subprocess.Popen(
        [sys.executable, "-c", HARNESS, json.dumps(CLI), how],
        env=cli_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert harness.stdin is not None and harness.stdout is not None
    try:
        hook_sh, mcp, mon = json.loads(harness.stdout.readline())
        hook = wait_for(lambda: _children_of(hook_sh), 60, "the hook's wait under its shell")[0]
        # Each child has its lifeline before the harness goes (one that finds its harness
        # gone before it starts runs on: docs/agents.md#lifeline).
        wait_for(
            lambda: all(_has_lifeline(p) for p in (hook, mcp, mon)), 60, "the children's lifelines"
        )
        harness.stdin.write("go\n")
        harness.stdin.flush()
        harness.wait(30)
        wait_for(
            lambda: (
                not any(_alive(p) for p in (hook, mcp, mon)) and not _crossintercom_pids(cli_env)
            ),
            30,
            lambda: f"children still alive: {_crossintercom_pids(cli_env)}",
        )
    finally:
        _reap(harness)


def test_mcp_ends_when_its_stdin_closes(cli_env: dict[str, str]) -> None:
    start_broker(cli_env)
    proc = subprocess.Popen(
        [*CLI, "mcp", "--as", "hm"],
        env=cli_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    try:
        wait_for(lambda: _has_lifeline(proc.pid), 60, "the MCP server running")
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        _reap(proc)


def test_named_harness_pid_is_watched(cli_env: dict[str, str]) -> None:
    """A plugin may name the process to outlive (CROSSINTERCOM_HARNESS_PID): `listen` in any
    format then ends with it, even though its own parent lives on."""
    start_broker(cli_env)
    stand_in = subprocess.Popen(["sleep", "600"])
    env = {**cli_env, "CROSSINTERCOM_HARNESS_PID": str(stand_in.pid)}
    line = " ".join(map(shlex.quote, CLI)) + " listen --as hn --json"
    proc = subprocess.Popen(["sh", "-c", f"exec {line}"], env=env, stdout=subprocess.PIPE)
    try:
        wait_for(lambda: _has_lifeline(proc.pid), 60, "listen running")
        stand_in.send_signal(signal.SIGKILL)
        stand_in.wait()
        proc.wait(30)
    finally:
        _reap(proc)
        _reap(stand_in)
