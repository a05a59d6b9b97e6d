"""Pi 1.6.0 joined through a gateway with nothing of crossintercom beside it: `setup pi
--gateway` writes `.pi/mcp.json` with the gateway's streamable HTTP server and the extension in
its gateway form; against the mock model, an RPC-mode session sends mail over HTTP MCP that the
peer receives, and once idle is woken by the extension's long poll of the gateway (fetch, the
token from the environment), the mail framed as a crossintercom message, nothing raw, and
marked shown (docs/agents.md#pi)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

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
from tests.harnesses.test_pi import Rpc


@pytest.fixture
def joined(mock_model: MockModel, harness_env: HarnessEnv) -> Iterator[Joined]:
    kit = kits.make("pi", mock_model, harness_env)
    with through_gateway(kit, "pi", harness_env) as joined:
        yield joined


def test_pi_over_http_mcp_sends_and_is_woken_by_the_extensions_poll(
    joined: Joined, mock_model: MockModel
) -> None:
    prompt, token = f"tell the planner {uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    mock_model.responder = send_once(prompt, token)
    rpc = Rpc(joined.sandbox)
    try:
        rpc.send({"id": "1", "type": "prompt", "message": prompt})
        rpc.settled(1)
        first = mock_model.wait_for(lambda r: prompt in r.all_text(), timeout=5)
        assert "mcp__crossintercom__send" in crossintercom_tools(first), first.tool_names
        sent = peer_receives(joined.host, token)
        assert sent["from"]["name"] == WORKER

        # Idle now: the extension's long poll of the gateway starts a run with the mail.
        hostile = woken_by_hostile_mail(joined, mock_model, 60)
        rpc.settled(2)
        messages = rpc.response({"type": "get_messages"})["messages"]
        holding = [m for m in messages if hostile.before in json.dumps(m)]
        assert [(m["role"], m.get("customType")) for m in holding] == [("custom", "crossintercom")]
        assert rpc.end("close") < 10
    finally:
        rpc.stop()
    shown_on_the_gateway(joined, hostile)
