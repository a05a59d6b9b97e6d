"""Claude Code 2.1.332 with `crossintercom setup claude-code --as worker`, against the mock
model (docs/agents.md#claude-code): the config is accepted and the tools load and run without a
prompt (the permission rule), a tool call sends mail the peer receives, mail to the idle session
starts a turn whose input holds it framed and nothing raw, a stream-json session and a one-shot
`claude -p` exit promptly (with mail pending too), no crossintercom child outlives Claude
Code however it ends, and a burst of long messages reaches the model through the inbox tool as
framed mail, not as Claude Code's refusal of an oversized tool result.

The session is driven as the SDK drives it: ``-p --input-format stream-json --output-format
stream-json`` over stdin. Claude Code starts MCP servers in the background, so a turn that begins
before the server is up is offered ``WaitForMcpServers``: the model's script calls it then.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from crossintercom.agents.handover.mail import HANDOVER_BYTES
from crossintercom.client import Client, Identity
from crossintercom.inbox import Inbox
from tests.conftest import settings_for, wait_for
from tests.harnesses import kits
from tests.harnesses.agentmail import (
    PEER,
    WORKER,
    Hostile,
    Running,
    children_gone,
    crossintercom_tools,
    joins,
    peer_receives,
    peer_send,
    pending_for_worker,
    setup_worker,
    shown_only_framed,
    worker_children,
)
from tests.harnesses.isolation import HarnessEnv
from tests.harnesses.mockmodel import MockModel, Reply, Request

WAIT_TOOL = "WaitForMcpServers"


class Session:
    """A stream-json Claude Code session: user turns in on stdin, events out on stdout."""

    def __init__(self, kit: kits.Kit, *extra: str) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        proc = kit.start(
            *("-p", "--input-format", "stream-json", "--output-format", "stream-json"),
            "--verbose",
            *extra,
            stdin=subprocess.PIPE,
        )
        self.running = Running(proc, self._line)

    def _line(self, line: str) -> None:
        with contextlib.suppress(ValueError):  # only the JSON event lines count
            self.events.put(json.loads(line))

    def say(self, text: str) -> None:
        stdin = self.running.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps({"type": "user", "message": {"role": "user", "content": text}}))
        stdin.write("\n")
        stdin.flush()

    def result(self, timeout: float = 60) -> dict[str, Any]:
        """The next turn's result event."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no result in {timeout}s; stderr: {''.join(self.running.stderr)}"
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if event.get("type") == "result":
                return event

    def end(self, how: signal.Signals) -> None:
        """Send Claude Code ``how`` and wait for it to exit."""
        self.running.proc.send_signal(how)
        self.running.proc.wait(15)

    def close_input(self) -> None:
        stdin = self.running.proc.stdin
        assert stdin is not None
        stdin.close()


def sends_when_asked(prompt: str, token: str) -> Any:
    """The model's script: asked ``prompt``, it waits for the MCP servers if crossintercom's
    tools are not offered yet, then calls send once; everything else gets a short answer."""
    state = {"sent": False}

    def script(req: Request) -> Reply:
        if prompt in req.all_text() and not state["sent"]:
            send = req.tool_named("crossintercom", "send")
            if send:
                state["sent"] = True
                return Reply.call(send, to=PEER, message=f"hello from the worker {token}")
            if WAIT_TOOL in req.tool_names:
                return Reply.call(WAIT_TOOL)
        return Reply.say("done")

    return script


def without_socket_hook(kit: kits.Kit) -> None:
    path = kit.cwd / ".claude" / "settings.local.json"
    settings = json.loads(path.read_text())
    del settings["hooks"]["SessionStart"]
    path.write_text(json.dumps(settings))


@pytest.fixture
def kit(mock_model: MockModel, harness_env: HarnessEnv) -> Iterator[kits.Kit]:
    kit = kits.make("claude", mock_model, harness_env)
    out = setup_worker(kit, "claude-code")
    assert "wrote" in out
    settings = json.loads((kit.cwd / ".claude" / "settings.local.json").read_text())
    assert "mcp__crossintercom" in settings["permissions"]["allow"]
    joins(kit)
    yield kit


def test_session_sends_is_woken_framed_and_exits_promptly(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    # The Stop hook alone, as where the messaging socket is absent (test_claude_socket.py
    # covers the socket, which would otherwise be first to show idle mail too).
    without_socket_hook(kit)
    token, prompt = uuid.uuid4().hex[:12], f"send the planner a hello {uuid.uuid4().hex[:6]}"
    mock_model.responder = sends_when_asked(prompt, token)
    session = Session(kit)
    try:
        session.say(prompt)
        first = session.result()
        assert first.get("subtype") == "success", first
        # the tools were offered and the send ran without a permission prompt
        assert any(crossintercom_tools(r) for r in mock_model.model_requests())
        got = peer_receives(kit, token)
        assert "worker" in json.dumps(got["from"])

        # idle now: mail from the peer starts a turn through the asyncRewake hook
        wait_for(lambda: "wait" in worker_children(harness_env), 30, "the Stop hook waiting")
        hostile = Hostile()
        peer_send(kit, hostile.text)
        woken = mock_model.wait_for(lambda r: hostile.before in r.all_text(), timeout=60)
        assert shown_only_framed(woken, hostile), woken.all_text()[-3000:]
        assert f"<<<crossintercom message from {PEER}@" in woken.all_text()
        for req in mock_model.model_requests():
            assert hostile.fake_end not in req.all_text()

        # the input ends: Claude Code exits as fast as without the hook, nothing left behind
        session.result()
        wait_for(lambda: "wait" in worker_children(harness_env), 30, "the hook waiting again")
        started = time.monotonic()
        session.close_input()
        session.running.proc.wait(15)
        assert time.monotonic() - started < 10
        children_gone(harness_env, timeout=10)
    finally:
        session.running.stop()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_children_end_with_claude_code(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv, how: signal.Signals
) -> None:
    session = Session(kit)
    try:
        session.say("hello")
        session.result()
        wait_for(
            lambda: {"mcp", "wait"} <= set(worker_children(harness_env)),
            30,
            "the MCP server and the Stop hook running",
        )
        # Either child may still be starting (Python's imports) when Claude Code goes: the
        # lifeline covers that too (docs/agents.md#lifeline).
        session.end(how)
        children_gone(harness_env, timeout=10)
    finally:
        session.running.stop()


def test_one_shot_exits_promptly_with_mail_pending(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    joins(kit, WORKER)
    token = f"pending {uuid.uuid4().hex[:8]}"
    peer_send(kit, token)
    started = time.monotonic()
    done = kit.run("hello")
    took = time.monotonic() - started
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert took < 60, f"claude -p took {took:.1f}s"
    # the Stop hook returned at once; the socket child hands the mail into the run (2.1.332
    # takes it as one more step before exiting) or it waits unseen for the next look
    children_gone(harness_env, timeout=10)
    seen = any(token in r.all_text() for r in mock_model.model_requests())
    assert seen != bool(pending_for_worker(kit))


def reads_the_inbox_when_asked(prompt: str) -> Any:
    """The model's script: asked ``prompt``, it calls the inbox tool once (after waiting for
    the MCP servers if need be); everything else gets a short answer."""
    state = {"called": False}

    def script(req: Request) -> Reply:
        if prompt in req.all_text() and not state["called"]:
            inbox = req.tool_named("crossintercom", "inbox")
            if inbox:
                state["called"] = True
                return Reply.call(inbox)
            if WAIT_TOOL in req.tool_names:
                return Reply.call(WAIT_TOOL)
        return Reply.say("done")

    return script


def test_a_burst_of_long_messages_reaches_the_model_framed_within_the_budget(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    """Twenty messages of 16,384 characters (some 330,000 in all, over Claude Code's 25,000
    tokens for a tool result): the inbox tool's result the binary hands the model holds
    frames, within the hand-over's budget (docs/agents.md#one-hand-over), and the rest wait."""
    without_socket_hook(kit)  # the inbox tool alone shows the mail
    joins(kit, WORKER)
    cfg = settings_for(kit.env)
    with Client(cfg, Identity.named(cfg, PEER)).connect() as peer:
        sent = [
            peer.send(WORKER, (f"[{n:02d}]\n" + f"long message {n:02d} line\n" * 800)[:16384]).id
            for n in range(20)
        ]
    prompt = f"read your crossintercom inbox {uuid.uuid4().hex[:8]}"
    mock_model.responder = reads_the_inbox_when_asked(prompt)
    done = kit.run(prompt)
    assert done.returncode == 0, (done.stdout, done.stderr)
    # the inbox call is the script's last: its result is the last the binary sent back
    # (before it, at most WaitForMcpServers's, which names the servers now connected)
    answered = mock_model.wait_for(
        lambda r: (
            bool(r.tool_results)
            and WAIT_TOOL not in r.tool_results[-1]
            and not r.tool_results[-1].startswith("ready:")
        ),
        timeout=30,
    )
    result = answered.tool_results[-1]
    assert result.startswith("crossintercom: "), result[:500]
    assert "exceeds maximum allowed tokens" not in result
    assert len(result.encode()) <= HANDOVER_BYTES
    assert f"<<<crossintercom message from {PEER}@" in result and f"id={sent[0]}" in result
    shown = result.count("<<<end crossintercom message")
    assert 1 <= shown < len(sent)
    assert f"{len(sent) - shown} more unseen messages not shown here" in result
    box = Inbox.of(cfg, Identity.named(cfg, WORKER).id)
    try:
        assert [e.body["id"] for e in box.unshown()] == sent[shown:]
    finally:
        box.close()
