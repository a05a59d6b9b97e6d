"""OpenCode 1.18.33 with `crossintercom setup opencode --as worker`, against the mock model
(docs/agents.md#opencode).

``opencode serve`` driven over its HTTP API loads the MCP entry and the plugin, offers
crossintercom's tools, sends mail through them, and is woken by mail while idle (the plugin's
promptAsync) with the framed text in the model's input; its children end with it on SIGTERM
and SIGKILL. A one-shot ``opencode run`` ends as it would without crossintercom, mail pending
or arriving meanwhile, and leaves that mail unseen for the next session.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
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

# A one-shot run with crossintercom installed must end about as fast as OpenCode alone (the
# baseline test); this bound only catches a run held open by a child.
ONE_SHOT_S = 90
TURN_S = 90


class Server(Running):
    """`opencode serve` on a free local port, and its HTTP API for the test's project."""

    def __init__(self, kit: Kit) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.project = str(kit.cwd)
        self.output: list[str] = []
        proc = kit.start("serve", "--hostname", "127.0.0.1", "--port", str(port))
        super().__init__(proc, self.output.append)
        wait_for(self._listening, 90, lambda: f"opencode serve to listen: {self.output[-10:]}")

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"opencode serve exited {self.proc.returncode}: {self.stderr}")
        return any("listening on http://" in line for line in self.output + self.stderr)

    def call(self, method: str, path: str, body: Any = None, timeout: float = TURN_S) -> Any:
        req = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"content-type": "application/json", "x-opencode-directory": self.project},
        )
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            raw = answer.read()
        return json.loads(raw) if raw else None

    def texts(self, session: str) -> list[tuple[str, str]]:
        """(role, text) of every text part in the session, in order."""
        out = []
        for message in self.call("GET", f"/session/{session}/message"):
            for part in message.get("parts", []):
                if part.get("type") == "text":
                    out.append((message["info"]["role"], part.get("text", "")))
        return out


def sdk_installed(config_dir: Path) -> None:
    """Mark OpenCode's plugin SDK as installed in the project's ``.opencode`` (kits.py does so
    for the user's config dir): before loading any plugin OpenCode installs
    ``@opencode-ai/plugin`` into each config dir from the npm registry, tens of seconds per
    fresh dir here, unless ``node_modules`` exists and package-lock.json names it.
    crossintercom's plugin imports nothing from it."""
    (config_dir / "node_modules").mkdir(parents=True, exist_ok=True)
    lock = {"packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}}
    (config_dir / "package-lock.json").write_text(json.dumps(lock))


@pytest.fixture
def oc_kit(mock_model: MockModel, harness_env: HarnessEnv) -> Kit:
    kit = kits.make("opencode", mock_model, harness_env)
    setup_worker(kit, "opencode")
    sdk_installed(kit.cwd / ".opencode")
    return kit


@pytest.fixture
def server(oc_kit: Kit) -> Iterator[Server]:
    serve = Server(oc_kit)
    try:
        yield serve
    finally:
        serve.stop()


def test_serve_sends_and_wakes_on_framed_mail(
    oc_kit: Kit, server: Server, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    prompt, token = f"tell the planner {uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    mock_model.responder = send_once(prompt, token)
    joins(oc_kit)
    session = server.call("POST", "/session", {})["id"]
    server.call(
        "POST", f"/session/{session}/message", {"parts": [{"type": "text", "text": prompt}]}
    )

    first = mock_model.wait_for(lambda r: prompt in r.all_text() and r.tool_names, timeout=5)
    assert "crossintercom_send" in crossintercom_tools(first), first.tool_names
    sent = peer_receives(oc_kit, token)
    assert sent["from"]["name"] == "worker"

    # Idle now: the plugin's waiter turns the peer's mail into the session's next prompt.
    wait_for(lambda: "wait" in worker_children(harness_env), 30, "the plugin's waiter")
    hostile = Hostile()
    seen = len(mock_model.requests)
    peer_send(oc_kit, hostile.text)
    woken = mock_model.wait_for(
        lambda r: hostile.before in r.all_text() and bool(r.tool_names), timeout=TURN_S, after=seen
    )
    assert shown_only_framed(woken, hostile), woken.all_text()[-2000:]
    wait_for(
        lambda: any(hostile.before in t for _, t in server.texts(session)), 30, "the woken turn"
    )

    server.proc.terminate()
    server.proc.wait(30)
    children_gone(harness_env)
    assert pending_for_worker(oc_kit) == []  # shown once, by the wake


def test_children_end_with_opencode_killed(
    oc_kit: Kit, server: Server, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    session = server.call("POST", "/session", {})["id"]
    server.call("POST", f"/session/{session}/message", {"parts": [{"type": "text", "text": "hi"}]})
    wait_for(
        lambda: {"mcp", "wait"} <= set(worker_children(harness_env)),
        30,
        "the MCP server and the plugin's waiter",
    )
    server.proc.kill()
    server.proc.wait(10)
    children_gone(harness_env, timeout=5)


@pytest.mark.parametrize("mail", ["none", "pending and arriving"])
def test_run_exits_with_mail_pending_and_arriving(
    mail: str, oc_kit: Kit, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    prompt = f"one shot {uuid.uuid4().hex[:8]}"
    before = f"waiting-{uuid.uuid4().hex[:8]}"
    during = f"meanwhile-{uuid.uuid4().hex[:8]}"
    sent: list[str] = []
    if mail != "none":
        joins(oc_kit, "worker")  # as an earlier session of the worker would have
        peer_send(oc_kit, before)
        sent.append(before)

    def script(req: Request) -> Reply:
        if mail != "none" and prompt in req.all_text() and req.tool_names and not sent[1:]:
            peer_send(oc_kit, during)  # arrives while the run is in flight
            sent.append(during)
        return Reply.say("one-shot answer")

    mock_model.responder = script
    started = time.monotonic()
    done = oc_kit.run(prompt, timeout=ONE_SHOT_S + 30)
    took = time.monotonic() - started
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "one-shot answer" in done.stdout
    assert took < ONE_SHOT_S, f"opencode run took {took:.1f}s"
    turn = mock_model.wait_for(lambda r: prompt in r.all_text() and r.tool_names, timeout=1)
    assert "crossintercom_send" in crossintercom_tools(turn), turn.tool_names
    children_gone(harness_env)
    # Nothing was shown to the one-shot run: the next session gets all of it.
    assert sorted(m["message"] for m in pending_for_worker(oc_kit)) == sorted(sent)
