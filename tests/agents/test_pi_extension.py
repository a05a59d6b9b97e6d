"""The Pi extension `setup pi` writes, run by Node 22 (which strips its types) with a stand-in
for Pi's API: it starts no waiter in one-shot modes, wakes with ``sendMessage`` as a followUp
that triggers a turn, stops its waiter on ``session_shutdown``, and a runtime that went away
under it (Pi's "extension ctx is stale") ends the watch instead of crashing Pi. Pi itself runs
the extension in tests/harnesses/test_pi.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.agents.conftest import waiting
from tests.conftest import run_cli
from tests.harnesses import install

# The stand-in: Pi's `on` and `sendMessage`; argv: MODE and what sendMessage does (ok|stale).
DRIVER = """
const [mode, onSend] = process.argv.slice(2);
const { default: extension } = await import(process.env.EXTENSION);
const handlers = {};
const pi = {
  on: (event, handler) => { handlers[event] = handler; },
  sendMessage: (message, options) => {
    console.log(JSON.stringify({ message, options }));
    if (onSend === "stale") throw new Error("This extension ctx is stale after reload");
  },
};
extension(pi);
await handlers.session_start({ reason: "startup" }, { mode });
process.stdin.on("data", async () => { await handlers.session_shutdown({ reason: "quit" }, {}); });
process.stdin.on("end", () => {});
console.error("started " + mode);
"""


@pytest.fixture
def node22() -> str:
    """Node 22 from the harness cache; not installed from here (the harness tests do that)."""
    node = install.NODE.executable()
    if not node.exists():
        pytest.skip(f"needs Node 22 (Pi's own) at {node}: python -m tests.harnesses.install")
    return str(node)


def extension(env: dict[str, str], project: Path) -> Path:
    out = run_cli(env, "setup", "pi", "--as", "worker", "--dir", str(project))
    assert out.returncode == 0, out.stderr
    return project / ".pi" / "extensions" / "crossintercom.ts"


def drive(
    node: str, env: dict[str, str], project: Path, mode: str, on_send: str = "ok"
) -> subprocess.Popen[str]:
    driver = project / "drive.mjs"
    driver.write_text(DRIVER)
    return subprocess.Popen(
        [node, str(driver), mode, on_send],
        env={**env, "EXTENSION": str(extension(env, project))},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ends_by_itself(proc: subprocess.Popen[str], stdin: str = "", within: float = 20) -> str:
    """Write ``stdin`` and close it; the driver's stdout once node exits on its own (nothing
    left holding its event loop)."""
    try:
        out, err = proc.communicate(stdin, timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"node kept running: {proc.communicate()}") from None
    assert proc.returncode == 0, err
    return out


@pytest.mark.parametrize("mode", ["print", "json"])
def test_one_shot_modes_start_nothing(
    mode: str, node22: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    proc = drive(node22, cli_env, tmp_path, mode)
    started = time.monotonic()
    assert ends_by_itself(proc) == ""
    assert time.monotonic() - started < 20


def test_mail_wakes_as_a_followup_and_shutdown_stops_the_waiter(
    node22: str, cli_env: dict[str, str], tmp_path: Path, runtime_home: Path
) -> None:
    proc = drive(node22, cli_env, tmp_path, "rpc")
    try:
        waiting(proc, runtime_home)
        run_cli(cli_env, "send", "--as", "planner", "--to", "worker", "wake up, review #9")
        assert proc.stdout is not None
        sent = json.loads(proc.stdout.readline())
        assert sent["options"] == {"triggerTurn": True, "deliverAs": "followUp"}
        assert sent["message"]["customType"] == "crossintercom"
        assert "from planner@testhost" in sent["message"]["content"]
        assert "wake up, review #9" in sent["message"]["content"]
        waiting(proc, runtime_home)  # it waits again for the next mail
        ends_by_itself(proc, "quit\n")  # session_shutdown: the waiter no longer holds node
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_runtime_gone_stale_ends_the_watch_without_a_crash(
    node22: str, cli_env: dict[str, str], tmp_path: Path, runtime_home: Path
) -> None:
    proc = drive(node22, cli_env, tmp_path, "tui", on_send="stale")
    try:
        waiting(proc, runtime_home)
        run_cli(cli_env, "send", "--as", "planner", "--to", "worker", "late news")
        out = ends_by_itself(proc)  # exit 0, and no second waiter was started
        assert "late news" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
