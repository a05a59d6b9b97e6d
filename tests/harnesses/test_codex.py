"""Codex 0.171.0 with `crossintercom setup codex --as worker`, against the mock model
(docs/agents.md#codex): the config is accepted, the required server's tools are offered on the
first request, a tool call sends mail the peer receives, `codex exec` exits promptly with mail
pending even with the Stop hook trusted, and an idle session is woken by mail framed (and nothing
raw), keeps listening after that continuation, and leaves nothing running when it ends.

The long-lived session is Codex's app-server (JSON-RPC over stdio, what its TUI and IDE
extensions drive). Its hook is trusted the way a user's `/hooks` review records it: the hook's
current hash from ``hooks/list`` written as ``[hooks.state."KEY"] trusted_hash`` in config.toml.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import json
import os
import pty
import queue
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crossintercom.agents.lifetime import codex_daemon
from tests.conftest import run_cli, wait_for
from tests.harnesses import kits
from tests.harnesses.agentmail import (
    WORKER,
    Hostile,
    Running,
    children_gone,
    crossintercom_tools,
    joins,
    peer_receives,
    peer_send,
    pending_for_worker,
    send_once,
    shown_only_framed,
    worker_children,
)
from tests.harnesses.isolation import HarnessEnv
from tests.harnesses.mockmodel import MockModel, Request


@pytest.fixture
def kit(mock_model: MockModel, harness_env: HarnessEnv) -> Iterator[kits.Kit]:
    kit = kits.make("codex", mock_model, harness_env)
    # as a user runs it: into $CODEX_HOME, the default
    out = run_cli(kit.env, "setup", "codex", "--as", WORKER)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "/hooks" in out.stdout and "trust" in out.stdout  # the hook needs the user's trust
    joins(kit)
    yield kit


def test_exec_sends_and_exits_promptly_with_mail_pending(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    joins(kit, WORKER)
    peer_send(kit, f"pending {uuid.uuid4().hex[:8]}")
    token, prompt = uuid.uuid4().hex[:12], f"send the planner a hello {uuid.uuid4().hex[:6]}"
    mock_model.responder = send_once(prompt, token)
    started = time.monotonic()
    # The hook runs (trusted for this run): in `codex exec` it must return at once.
    done = kit.run(prompt, "--dangerously-bypass-hook-trust")
    took = time.monotonic() - started
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert took < 60, f"codex exec took {took:.1f}s"
    first = mock_model.wait_for(lambda r: prompt in r.all_text(), timeout=1)
    assert crossintercom_tools(first)  # required = true: the server was up before the turn
    peer_receives(kit, token)
    assert len(pending_for_worker(kit)) == 1  # the hook showed nothing
    children_gone(harness_env, timeout=10)


class AppServer:
    """`codex app-server` over stdio: requests in, responses and notifications out."""

    def __init__(self, kit: kits.Kit) -> None:
        self.kit = kit
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.running = Running(kit.start("app-server", stdin=subprocess.PIPE), self._line)
        self.next_id = 0
        self.request("initialize", clientInfo={"name": "crossintercom-test", "version": "1"})
        self.notify("initialized")

    def _line(self, line: str) -> None:
        try:
            self.lines.put(json.loads(line))
        except ValueError:
            return

    def _write(self, obj: dict[str, Any]) -> None:
        stdin = self.running.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps(obj) + "\n")
        stdin.flush()

    def notify(self, method: str, **params: Any) -> None:
        self._write({"method": method, "params": params})

    def until(self, match: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.lines.get(timeout=min(left, 1))
            except queue.Empty:
                continue
            if match(msg):
                return msg
        raise AssertionError(f"no such message in {timeout}s: {''.join(self.running.stderr)}")

    def request(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        n = self.next_id
        self._write({"id": n, "method": method, "params": params})
        reply = self.until(lambda m: m.get("id") == n)
        assert "error" not in reply, reply
        return dict(reply["result"])

    def trust_hooks(self) -> None:
        """What a person's review in /hooks records: each hook's current hash."""
        listed = self.request("hooks/list", cwds=[str(self.kit.cwd)])["data"][0]["hooks"]
        ours = [h for h in listed if "crossintercom" in h["command"]]
        assert ours and all(h["trustStatus"] != "trusted" for h in ours)
        config = self.kit.config
        lines = [
            f"\n[hooks.state.{json.dumps(h['key'])}]\ntrusted_hash = {json.dumps(h['currentHash'])}"
            for h in ours
        ]
        config.write_text(config.read_text() + "".join(lines) + "\n")
        listed = self.request("hooks/list", cwds=[str(self.kit.cwd)])["data"][0]["hooks"]
        assert all(h["trustStatus"] == "trusted" for h in listed if "crossintercom" in h["command"])

    def idle_session(self) -> None:
        """A thread with the hook trusted, one turn done: its Stop hook waits for mail."""
        self.trust_hooks()
        thread = self.request("thread/start", cwd=str(self.kit.cwd))["thread"]["id"]
        self.request("turn/start", threadId=thread, input=[{"type": "text", "text": "hello"}])
        self.until(hook_started)


def unescaped(req: Request) -> Request:
    """The request as the model reads it: Codex 0.171 hands a Stop hook's reason to the model
    inside ``<hook_prompt>``, with ``<``, ``>`` and ``&`` written as entities."""
    body = json.loads(html.unescape(json.dumps(req.body)))
    return dataclasses.replace(req, body=body)


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def hook_started(msg: dict[str, Any]) -> bool:
    return msg.get("method") == "hook/started"


def test_idle_session_is_woken_framed_and_keeps_listening(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    server = AppServer(kit)
    try:
        server.idle_session()  # one turn done; its Stop hook waits for mail
        first = Hostile()
        peer_send(kit, first.text)
        woken = mock_model.wait_for(lambda r: first.before in r.all_text(), timeout=60)
        assert "<hook_prompt" in woken.all_text()  # the hook's continuation
        assert shown_only_framed(unescaped(woken), first), woken.all_text()[-3000:]

        # after that continuation (stop_hook_active) the hook waits again: a second message
        # wakes the session too
        server.until(hook_started)
        second = Hostile()
        peer_send(kit, second.text)
        again = mock_model.wait_for(lambda r: second.before in r.all_text(), timeout=60)
        assert shown_only_framed(unescaped(again), second), again.all_text()[-3000:]
        for req in mock_model.model_requests():
            assert first.fake_end not in unescaped(req).all_text()

        # the client goes: the app-server ends, and every child with it
        server.until(hook_started)
        stdin = server.running.proc.stdin
        assert stdin is not None
        stdin.close()
        server.running.proc.wait(20)
        children_gone(harness_env, timeout=10)
    finally:
        server.running.stop()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_children_end_with_codex(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv, how: signal.Signals
) -> None:
    """The MCP server and the waiting Stop hook end with the Codex process however it ends."""
    server = AppServer(kit)
    try:
        server.idle_session()
        wait_for(lambda: {"mcp", "wait"} <= set(worker_children(harness_env)), 30, "children")
        # the native binary (under the npm wrapper, if any) is the harness to end
        native = [p for p in harness_env.leftovers() if _exe(p).endswith("/codex")]
        assert len(native) == 1, harness_env.describe(harness_env.leftovers())
        os.kill(native[0], how)
        server.running.proc.wait(20)
        children_gone(harness_env, timeout=10)
    finally:
        server.running.stop()


class Tui:
    """The `codex` TUI under a pseudo-terminal, started with ``args`` (a first prompt). Codex
    0.171 runs its session in the app-server daemon it starts (or attaches to) unless told
    otherwise; the terminal's output is read (and its cursor-position queries answered) by a
    thread until it closes."""

    def __init__(self, kit: kits.Kit, *args: str) -> None:
        env = {**kit.env, "PWD": str(kit.cwd), "TERM": "xterm-256color"}
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: becomes the TUI
            os.chdir(kit.cwd)
            os.execvpe(kit.argv[0], [*kit.argv, *args], env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            if b"\x1b[6n" in data:  # where is the cursor? (the TUI waits for the answer)
                with contextlib.suppress(OSError):
                    os.write(self.fd, b"\x1b[1;1R")

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        os.close(self.fd)
        self.reader.join(10)


def _trust_hooks(kit: kits.Kit) -> None:
    """The hook trusted as a person's `/hooks` review records it (through a stdio app-server,
    which is then closed), so the TUI runs with no flag that keeps it off the daemon."""
    server = AppServer(kit)
    try:
        server.trust_hooks()
    finally:
        server.running.stop()


@pytest.mark.parametrize("how", ["/quit", signal.SIGTERM, signal.SIGKILL], ids=str)
def test_children_end_with_the_tui_on_the_daemon(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv, how: str | signal.Signals
) -> None:
    """A TUI session lives in the app-server daemon, which outlives the TUI: the MCP server and
    the waiting Stop hook still end within seconds of the TUI ending, and mail sent afterwards
    starts no model turn (it stays unseen for the next session)."""
    _trust_hooks(kit)
    tui = Tui(kit, "hello")
    try:
        wait_for(lambda: {"mcp", "wait"} <= set(worker_children(harness_env)), 90, "children")
        children = worker_children(harness_env)
        assert codex_daemon.is_daemon(_parent(children["wait"]))  # the daemon runs them
        assert codex_daemon.is_daemon(_parent(children["mcp"]))
        daemon = _parent(children["wait"])
        assert codex_daemon.has_clients(daemon)  # the TUI is attached
        if isinstance(how, str):
            quit_tui(tui, how)
        else:
            native = codex_daemon.clients(str(kit.cwd.resolve()))
            assert len(native) == 1, harness_env.describe(native)
            os.kill(native[0], how)
        wait_for(lambda: not worker_children(harness_env), 5, "the children to end")
        # what a child started in that instant reads: no client left on the daemon
        wait_for(lambda: not codex_daemon.has_clients(daemon), 5, "the TUI to detach")
        seen = len(mock_model.model_requests())
        peer_send(kit, f"after the tui {uuid.uuid4().hex[:8]}")
        deadline = time.monotonic() + 5  # a woken session would ask the model at once
        while time.monotonic() < deadline:
            assert len(mock_model.model_requests()) == seen
            time.sleep(0.1)
        assert len(pending_for_worker(kit)) == 1  # left unseen for the next session
    finally:
        tui.close()
        harness_env.kill_all()  # the daemon, and its updater
        # the daemon's copy of the Codex package (over 400 MB) is not kept with the test's files
        shutil.rmtree(kit.config.parent / "packages", ignore_errors=True)


def _parent(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[1])


def quit_tui(tui: Tui, command: str, within: float = 90) -> None:
    """Type ``command`` and Enter until the TUI process has exited. Typed while the first turn
    still runs it may not be taken, and Enter pressed right after the keys (or again and again)
    reads as the end of a paste, a new line rather than a submit: so the line is cleared and
    the command typed again every few seconds, Enter half a second after it."""
    last = -10.0

    def gone() -> bool:
        nonlocal last
        if time.monotonic() - last > 3:
            with contextlib.suppress(OSError):
                tui.type("\x7f" * 16 + command)
                time.sleep(0.5)
                tui.type("\r")
            last = time.monotonic()
        with contextlib.suppress(ChildProcessError):
            return os.waitpid(tui.pid, os.WNOHANG)[0] == tui.pid
        return True

    wait_for(gone, within, "the TUI to quit", interval=0.1)


def test_children_end_with_an_in_process_tui(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    """`--no-daemon` keeps the session in the TUI's own process: its children end at `/quit`."""
    _trust_hooks(kit)
    tui = Tui(kit, "--no-daemon", "hello")
    try:
        wait_for(lambda: {"mcp", "wait"} <= set(worker_children(harness_env)), 90, "children")
        children = worker_children(harness_env)
        assert not codex_daemon.is_daemon(_parent(children["wait"]))  # the TUI runs them
        quit_tui(tui, "/quit")
        children_gone(harness_env, timeout=5)
    finally:
        tui.close()
