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
from tests.harnesses.agentmail import WORKER, crossintercom_tools, peer_receives, send_once
from tests.harnesses.gatewayed import (
    Joined,
    shown_on_the_gateway,
    through_gateway,
    woken_by_hostile_mail,
)
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
        hostile = woken_by_hostile_mail(joined, mock_model, TURN_S)
        wait_for(
            lambda: any(hostile.before in t for _, t in server.texts(session)), 30, "the woken turn"
        )
    finally:
        server.stop()
    shown_on_the_gateway(joined, hostile)
    listed = run_cli(joined.host.env, "inbox", "--as", WORKER, "--json")
    assert hostile.before in listed.stdout, (listed.stdout, listed.stderr)  # saved, not lost
