"""Pi 1.6.0 with `crossintercom setup pi --as worker`, against the mock model (docs/agents.md#pi).

An RPC-mode session (Pi's own interactive protocol over stdin/stdout) loads the MCP entry and
the extension once the project is trusted (``--approve``), offers crossintercom's tools, sends
mail through them, and is woken by mail while idle with the framed text in the model's input;
its children end with it however it ends. One-shot runs (``--print``, ``--mode json``) end as
they would without crossintercom, mail pending or arriving meanwhile, and leave that mail
unseen for the next session.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.harnesses import kits
from tests.harnesses.agentmail import (
    Hostile,
    Running,
    children_gone,
    crossintercom_tools,
    joins,
    peer_receives,
    peer_send,
    pending_for_worker,
    send_once,
    setup_worker,
    shown_only_framed,
    worker_children,
)
from tests.harnesses.isolation import HarnessEnv
from tests.harnesses.kits import Kit
from tests.harnesses.mockmodel import MockModel, Reply, Request

# Project resources (.pi/mcp.json, .pi/extensions) load only in a trusted project; headless
# modes cannot ask, so the test approves on the command line.
TRUST = "--approve"
# A one-shot run with crossintercom installed must end about as fast as Pi alone (the baseline
# test); this bound only catches a run held open by a child.
ONE_SHOT_S = 60


class Rpc(Running):
    """`pi --mode rpc`: commands on stdin, events read from stdout."""

    def __init__(self, kit: Kit) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        proc = kit.start("--mode", "rpc", "--no-session", TRUST, stdin=subprocess.PIPE)
        super().__init__(proc, self._event)

    def _event(self, line: str) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        with self._lock:
            self.events.append(event)

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def response(self, command: dict[str, Any], timeout: float = 20) -> dict[str, Any]:
        """Send ``command`` with a fresh id; its response's data."""
        rid = uuid.uuid4().hex
        self.send({**command, "id": rid})

        def answered() -> dict[str, Any] | None:
            with self._lock:
                return next((e for e in self.events if e.get("id") == rid), None)

        got = wait_for(answered, timeout, f"the response to {command}")
        assert got["success"], got
        return dict(got.get("data") or {})

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(1 for e in self.events if e.get("type") == kind)

    def settled(self, n: int, timeout: float = 60) -> None:
        """Wait for the ``n``-th run to settle (Pi will not continue on its own)."""

        def done() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"pi exited {self.proc.returncode}: {self.stderr[-20:]}")
            return self.count("agent_settled") >= n

        wait_for(done, timeout, lambda: f"run {n} to settle; events {self.events[-5:]}")

    def end(self, how: str) -> float:
        """End Pi (``close``: stdin reaches its end, as a client quitting; or a signal);
        returns how long it took to exit."""
        started = time.monotonic()
        if how == "close":
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        else:
            self.proc.send_signal(getattr(signal, how))
        self.proc.wait(30)
        return time.monotonic() - started


@pytest.fixture
def pi_kit(mock_model: MockModel, harness_env: HarnessEnv) -> Kit:
    kit = kits.make("pi", mock_model, harness_env)
    setup_worker(kit, "pi")
    return kit


@pytest.fixture
def rpc(pi_kit: Kit) -> Iterator[Rpc]:
    session = Rpc(pi_kit)
    try:
        yield session
    finally:
        session.stop()


def test_rpc_session_sends_and_wakes_on_framed_mail(
    pi_kit: Kit, rpc: Rpc, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    prompt, token = f"tell the planner {uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    mock_model.responder = send_once(prompt, token)
    joins(pi_kit)
    rpc.send({"id": "1", "type": "prompt", "message": prompt})
    rpc.settled(1)

    first = mock_model.wait_for(lambda r: prompt in r.all_text(), timeout=5)
    assert "mcp__crossintercom__send" in crossintercom_tools(first), first.tool_names
    sent = peer_receives(pi_kit, token)
    assert sent["from"]["name"] == "worker"

    # Idle now: mail from the peer starts a run by itself, the text framed in the model input.
    hostile = Hostile()
    seen = len(mock_model.requests)
    peer_send(pi_kit, hostile.text)
    woken = mock_model.wait_for(lambda r: hostile.before in r.all_text(), timeout=60, after=seen)
    assert shown_only_framed(woken, hostile), woken.all_text()[-2000:]
    rpc.settled(2)
    # In the conversation as a crossintercom message, not as something the user typed.
    messages = rpc.response({"type": "get_messages"})["messages"]
    holding = [m for m in messages if hostile.before in json.dumps(m)]
    assert [(m["role"], m.get("customType")) for m in holding] == [("custom", "crossintercom")]

    assert rpc.end("close") < 10
    children_gone(harness_env)
    assert pending_for_worker(pi_kit) == []  # shown once, by the wake


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_children_end_with_pi(how: str, pi_kit: Kit, rpc: Rpc, harness_env: HarnessEnv) -> None:
    # A settled run had crossintercom's tools: the MCP server is up, past its start.
    rpc.send({"id": "1", "type": "prompt", "message": "hello"})
    rpc.settled(1)
    both = wait_for(
        lambda: {"mcp", "wait"} <= set(worker_children(harness_env)),
        60,
        "the MCP server and the extension's waiter",
    )
    assert both
    rpc.end(how)
    children_gone(harness_env, timeout=5)


@pytest.mark.parametrize("mode", ["--print", "--mode json"])
def test_one_shot_exits_with_mail_pending_and_arriving(
    mode: str, pi_kit: Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    prompt = f"one shot {uuid.uuid4().hex[:8]}"
    before = f"waiting-{uuid.uuid4().hex[:8]}"
    during = f"meanwhile-{uuid.uuid4().hex[:8]}"
    joins(pi_kit, "worker")  # as an earlier session of the worker would have
    if mode == "--mode json":
        peer_send(pi_kit, before)  # already pending when Pi starts

    def script(req: Request) -> Reply:
        if prompt in req.all_text() and not req.tool_results:
            peer_send(pi_kit, during)  # arrives while the run is in flight
        return Reply.say("one-shot answer")

    mock_model.responder = script
    started = time.monotonic()
    done = subprocess.run(
        [*pi_kit.argv, *mode.split(), prompt, TRUST],
        env=pi_kit.env,
        cwd=pi_kit.cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=ONE_SHOT_S + 30,
        check=False,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "stale" not in done.stderr, done.stderr
    assert took < ONE_SHOT_S, f"pi {mode} took {took:.1f}s"
    turn = mock_model.wait_for(lambda r: prompt in r.all_text(), timeout=1)
    assert "mcp__crossintercom__send" in crossintercom_tools(turn), turn.tool_names
    children_gone(harness_env)
    # Nothing was shown to the one-shot run: the next session gets all of it.
    texts = [m["message"] for m in pending_for_worker(pi_kit)]
    assert during in texts and (before in texts or mode == "--print"), texts
