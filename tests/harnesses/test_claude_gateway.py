"""Claude Code 2.1.332 joined through a gateway with nothing of crossintercom beside it: `setup
claude-code --gateway` writes an http MCP entry and a curl wake hook; against the mock model, a
tool call over HTTP MCP sends mail the peer receives, and mail from the peer wakes the idle
session framed, nothing raw (docs/agents.md#mcp-over-http). The gateway runs with TLS (a test
CA) on the peer's host; Claude Code's environment holds only the token and the CA, no
crossintercom setting."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.harnesses import kits
from tests.harnesses.agentmail import Hostile, peer_receives, peer_send, shown_only_framed
from tests.harnesses.gatewayed import Joined, through_gateway
from tests.harnesses.isolation import HarnessEnv
from tests.harnesses.mockmodel import MockModel
from tests.harnesses.test_claude_code import Session, sends_when_asked


@pytest.fixture
def joined(mock_model: MockModel, harness_env: HarnessEnv) -> Iterator[Joined]:
    kit = kits.make("claude", mock_model, harness_env)
    with through_gateway(kit, "claude-code", harness_env) as joined:
        yield joined


def test_claude_code_over_http_mcp_sends_and_is_woken_by_curl(
    joined: Joined, mock_model: MockModel
) -> None:
    token, prompt = uuid.uuid4().hex[:12], f"send the planner a hello {uuid.uuid4().hex[:6]}"
    mock_model.responder = sends_when_asked(prompt, token)
    session = Session(joined.sandbox)
    try:
        session.say(prompt)
        first = session.result(timeout=120)
        assert first.get("subtype") == "success", first
        got = peer_receives(joined.host, token)
        assert "worker" in str(got["from"])

        # Idle now: mail from the peer comes back through the curl Stop hook, framed.
        hostile = Hostile()
        peer_send(joined.host, hostile.text)
        woken = mock_model.wait_for(lambda r: hostile.before in r.all_text(), timeout=120)
        assert shown_only_framed(woken, hostile), woken.all_text()[-3000:]
        for req in mock_model.model_requests():
            assert hostile.fake_end not in req.all_text()
        session.result(timeout=120)
    finally:
        session.running.stop()
