"""OpenCode 1.18.33 joined through a gateway with nothing of crossintercom beside it: `setup
opencode --gateway` writes the remote MCP entry and the wake plugin in its gateway form; against
the mock model, `opencode serve` sends mail over HTTP MCP that the peer receives, and once idle
is woken by the plugin's long poll of the gateway (fetch, the token from the environment), the
mail framed, nothing raw, and marked shown (docs/agents.md#opencode)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import run_cli, wait_for
from tests.harnesses import kits
from tests.harnesses.agentmail import (
    WORKER,
    Hostile,
    crossintercom_tools,
    peer_receives,
    peer_send,
    send_once,
    shown_only_framed,
)
from tests.harnesses.gatewayed import Joined, through_gateway
from tests.harnesses.isolation import HarnessEnv
from tests.harnesses.mockmodel import MockModel
from tests.harnesses.test_opencode import TURN_S, Server, sdk_installed


@pytest.fixture
def joined(mock_model: MockModel, harness_env: HarnessEnv) -> Iterator[Joined]:
    kit = kits.make("opencode", mock_model, harness_env)
    with through_gateway(kit, "opencode", harness_env) as joined:
        sdk_installed(kit.cwd / ".opencode")
        yield joined


def test_opencode_over_http_mcp_sends_and_is_woken_by_the_plugins_poll(
    joined: Joined, mock_model: MockModel
) -> None:
    prompt, token = f"tell the planner {uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    mock_model.responder = send_once(prompt, token)
    server = Server(joined.sandbox)
    try:
        session = server.call("POST", "/session", {})["id"]
        server.call(
            "POST", f"/session/{session}/message", {"parts": [{"type": "text", "text": prompt}]}
        )
        first = mock_model.wait_for(lambda r: prompt in r.all_text() and r.tool_names, timeout=5)
        assert "crossintercom_send" in crossintercom_tools(first), first.tool_names
        sent = peer_receives(joined.host, token)
        assert sent["from"]["name"] == WORKER

        # Idle now: the plugin's long poll of the gateway turns the peer's mail into a prompt.
        hostile = Hostile()
        seen = len(mock_model.requests)
        peer_send(joined.host, hostile.text)
        woken = mock_model.wait_for(
            lambda r: hostile.before in r.all_text() and bool(r.tool_names),
            timeout=TURN_S,
            after=seen,
        )
        assert shown_only_framed(woken, hostile), woken.all_text()[-2000:]
        wait_for(
            lambda: any(hostile.before in t for _, t in server.texts(session)), 30, "the woken turn"
        )
        for req in mock_model.model_requests():
            assert hostile.fake_end not in req.all_text()
    finally:
        server.stop()
    # Confirmed: the gateway's session holds it as shown, not unseen for the next poll.
    listed = run_cli(joined.host.env, "inbox", "--as", WORKER, "--json")
    assert hostile.before in listed.stdout, (listed.stdout, listed.stderr)
    unseen = run_cli(joined.host.env, "inbox", "--as", WORKER, "--unseen", "--json")
    assert unseen.returncode == 0 and hostile.before not in unseen.stdout, unseen.stdout
