"""Claude Code 2.1.332's messaging socket (docs/agents.md#claude-code): the SessionStart hook
`setup claude-code` writes leaves a child that delivers mail into a busy session between tool
calls, framed, as a message from another session (not the user), in a stream-json session and
in a one-shot `claude -p` worker; the mail is shown once, and the child ends with Claude Code.

The model's script keeps the turn busy with short Bash calls (`sleep 1`) until the mail shows.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import wait_for
from tests.harnesses import kits
from tests.harnesses.agentmail import (
    Hostile,
    children_gone,
    joins,
    peer_send,
    pending_for_worker,
    setup_worker,
    shown_only_framed,
    worker_children,
)
from tests.harnesses.isolation import HarnessEnv
from tests.harnesses.mockmodel import MockModel, Reply, Request, Responder
from tests.harnesses.test_claude_code import Session

NOT_THE_USER = "not typed by your user"
MAX_STEPS = 12


@pytest.fixture
def kit(mock_model: MockModel, harness_env: HarnessEnv) -> Iterator[kits.Kit]:
    kit = kits.make("claude", mock_model, harness_env)
    setup_worker(kit, "claude-code")
    settings = json.loads((kit.cwd / ".claude" / "settings.local.json").read_text())
    (start,) = settings["hooks"]["SessionStart"]
    assert "--format claude-socket" in start["hooks"][0]["command"]
    joins(kit)
    yield kit


def busy_until(prompt: str, token: str) -> Responder:
    """Asked ``prompt``, the model runs `sleep 1` step after step until ``token`` shows."""

    def script(req: Request) -> Reply:
        bash = req.tool_named("Bash")
        text = req.all_text()
        if bash and prompt in text and token not in text and len(req.tool_results) < MAX_STEPS:
            return Reply.call(bash, command="sleep 1", description="wait a second")
        return Reply.say("done")

    return script


def mid_turn(mock_model: MockModel, prompt: str, hostile: Hostile) -> Request:
    """The request that shows the mail: in the prompt's turn, after a tool call."""
    req = mock_model.wait_for(lambda r: hostile.before in r.all_text(), timeout=60)
    assert prompt in req.all_text() and req.tool_results, req.all_text()[-2000:]
    assert shown_only_framed(req, hostile), req.all_text()[-3000:]
    assert NOT_THE_USER in req.all_text()
    return req


def test_busy_session_gets_mail_between_tool_calls(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    prompt, hostile = f"keep busy {uuid.uuid4().hex[:8]}", Hostile()
    mock_model.responder = busy_until(prompt, hostile.before)
    session = Session(kit, "--allowedTools", "Bash")
    try:
        session.say(prompt)
        mock_model.wait_for(lambda r: prompt in r.all_text(), timeout=60)
        wait_for(lambda: "socket" in worker_children(harness_env), 30, "the socket child")
        peer_send(kit, hostile.text)
        shown = mid_turn(mock_model, prompt, hostile).all_text().count(hostile.before)
        assert session.result().get("subtype") == "success"
        # idle now: the next mail wakes the session (Stop hook or socket, whichever shows it
        # first); the first message is in its history once, not shown a second time
        wait_for(lambda: "wait" in worker_children(harness_env), 30, "the Stop hook waiting")
        later = f"later-{uuid.uuid4().hex[:8]}"
        peer_send(kit, later)
        woken = mock_model.wait_for(lambda r: later in r.all_text(), timeout=60)
        assert woken.all_text().count(hostile.before) == shown, woken.all_text()[-3000:]
        session.result()
        session.end(signal.SIGTERM)
        children_gone(harness_env, timeout=10)
    finally:
        session.running.stop()


def test_one_shot_worker_gets_mail_mid_turn(
    kit: kits.Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    prompt, hostile = f"work a while {uuid.uuid4().hex[:8]}", Hostile()
    mock_model.responder = busy_until(prompt, hostile.before)
    done: list[subprocess.CompletedProcess[str]] = []
    run = threading.Thread(target=lambda: done.append(kit.run(prompt, "--allowedTools", "Bash")))
    run.start()
    mock_model.wait_for(lambda r: prompt in r.all_text(), timeout=60)
    wait_for(lambda: "socket" in worker_children(harness_env), 30, "the socket child")
    peer_send(kit, hostile.text)
    mid_turn(mock_model, prompt, hostile)
    run.join(120)
    assert done and done[0].returncode == 0, done
    children_gone(harness_env, timeout=10)
    assert pending_for_worker(kit) == []  # shown once, by the socket


def test_without_the_socket_the_hook_starts_nothing(kit: kits.Kit, harness_env: HarnessEnv) -> None:
    """Outside Claude Code (no socket exported) the hook returns at once and leaves nothing."""
    out = subprocess.run(
        ["crossintercom", "wait", "--as", "worker", "--format", "claude-socket"],
        env=kit.env,
        cwd=kit.cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    children_gone(harness_env, timeout=10)
