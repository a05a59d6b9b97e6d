"""The mock model server over real HTTP, in each wire format, streaming and not; and the skip or
fail of a harness that cannot be installed. No harness runs here."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.harnesses import install
from tests.harnesses.isolation import require_harness
from tests.harnesses.mockmodel import MockModel, Reply, Request

TOOLS_RESPONSES = [
    {"type": "function", "name": "exec_command", "parameters": {}},
    {"type": "namespace", "name": "mcp__box", "tools": [{"type": "function", "name": "send"}]},
]


def post(model: MockModel, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    req = urllib.request.Request(
        model.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def events(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) of each server-sent event."""
    out: list[tuple[str | None, Any]] = []
    for chunk in raw.decode().strip().split("\n\n"):
        name = None
        data = ""
        for line in chunk.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


def test_anthropic_streams_a_tool_call_and_answers_plain_json(mock_model: MockModel) -> None:
    def script(req: Request) -> Reply:
        if not req.tool_results:
            return Reply.call(req.tool_named("box", "send") or "?", to="peer", message="hi")
        return Reply.say("done: " + req.tool_results[0])

    mock_model.responder = script
    tools = [{"name": "Bash"}, {"name": "mcp__box__send"}]
    body: dict[str, Any] = {"model": "m", "stream": True, "system": "SYS", "tools": tools,
            "messages": [{"role": "user", "content": "go"}]}  # fmt: skip
    status, ctype, raw = post(mock_model, "/v1/messages", body)
    assert (status, ctype) == (200, "text/event-stream")
    seen = events(raw)
    assert [name for name, _ in seen] == [
        "message_start", "content_block_start", "ping", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    block = seen[1][1]["content_block"]
    assert (block["type"], block["name"]) == ("tool_use", "mcp__box__send")
    partial = "".join(d["delta"]["partial_json"] for n, d in seen if n == "content_block_delta")
    assert json.loads(partial) == {"to": "peer", "message": "hi"}
    assert seen[6][1]["delta"]["stop_reason"] == "tool_use"

    result = {"type": "tool_result", "tool_use_id": block["id"],
              "content": [{"type": "text", "text": "sent #1"}]}  # fmt: skip
    body = {**body, "stream": False,
            "messages": [*body["messages"], {"role": "user", "content": [result]}]}  # fmt: skip
    status, _, raw = post(mock_model, "/v1/messages", body)
    answer = json.loads(raw)
    assert answer["content"] == [{"type": "text", "text": "done: sent #1"}]
    assert answer["stop_reason"] == "end_turn"
    last = mock_model.requests[-1]
    assert last.tool_names == ["Bash", "mcp__box__send"]
    assert last.all_text().split("\n")[:2] == ["SYS", "go"]
    assert "sent #1" in last.all_text()


def test_responses_calls_a_namespaced_tool_by_its_wire_name(mock_model: MockModel) -> None:
    mock_model.responder = lambda req: Reply.call("mcp__box__send", to="peer")
    body: dict[str, Any] = {"model": "m", "stream": True, "tools": TOOLS_RESPONSES,
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "go"}]}]}  # fmt: skip
    _, _, raw = post(mock_model, "/v1/responses", body)
    seen = events(raw)
    names = [name for name, _ in seen]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert names.index("response.output_item.added") < names.index("response.output_item.done")
    item = dict(seen)["response.output_item.done"]["item"]
    assert (item["type"], item["namespace"], item["name"]) == ("function_call", "mcp__box", "send")
    assert json.loads(item["arguments"]) == {"to": "peer"}
    assert dict(seen)["response.completed"]["response"]["usage"]["total_tokens"] > 0
    assert mock_model.requests[-1].tool_names == ["exec_command", "mcp__box__send"]

    output = {"type": "function_call_output", "call_id": item["call_id"], "output": "sent"}
    mock_model.responder = lambda req: Reply.say("|".join(req.tool_results))
    body = {**body, "stream": False, "input": [*body["input"], item, output]}
    _, _, raw = post(mock_model, "/v1/responses", body)
    message = json.loads(raw)["output"][0]
    assert message["content"][0]["text"] == "sent"


def test_chat_completions_stream_and_not(mock_model: MockModel) -> None:
    mock_model.responder = lambda req: Reply.call("send", to="x")
    tools = [{"type": "function", "function": {"name": "send", "parameters": {}}}]
    body: dict[str, Any] = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
            "tools": tools, "messages": [{"role": "user", "content": "go"}]}  # fmt: skip
    _, _, raw = post(mock_model, "/v1/chat/completions", body)
    seen = [data for _, data in events(raw)]
    assert seen[-1] == "[DONE]"
    call = seen[0]["choices"][0]["delta"]["tool_calls"][0]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "send",
        {"to": "x"},
    )
    assert seen[1]["choices"][0]["finish_reason"] == "tool_calls"
    assert seen[2]["usage"]["total_tokens"] > 0

    mock_model.responder = lambda req: Reply.say(req.tool_results[0])
    reply = {"role": "assistant", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": call["id"], "content": "sent"}
    body = {**body, "stream": False, "messages": [*body["messages"], reply, result]}
    _, _, raw = post(mock_model, "/v1/chat/completions", body)
    assert json.loads(raw)["choices"][0]["message"] == {"role": "assistant", "content": "sent"}


def test_side_endpoints_unknown_paths_and_a_failing_responder() -> None:
    with MockModel() as model:
        with urllib.request.urlopen(model.base_url + "/v1/models", timeout=10) as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "mock-model"
        status, _, raw = post(model, "/v1/messages/count_tokens", {"messages": []})
        assert status == 200 and json.loads(raw)["input_tokens"] > 0
        assert post(model, "/v1/nothing", {})[0] == 404

        def broken(req: Request) -> Reply:
            raise RuntimeError("script bug")

        model.responder = broken
        status, _, raw = post(model, "/v1/messages", {"messages": []})
        assert status == 500 and "script bug" in raw.decode()
        assert [str(e) for e in model.errors] == ["script bug"]
        assert [r.path for r in model.requests][:3] == [
            "/v1/models", "/v1/messages/count_tokens", "/v1/nothing",
        ]  # fmt: skip
        with pytest.raises(AssertionError, match="no matching model request"):
            model.wait_for(lambda r: r.api == "chat", timeout=0.2)


@pytest.mark.parametrize("required", [False, True])
def test_a_harness_that_cannot_be_installed_skips_or_fails(
    required: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CROSSINTERCOM_HARNESS_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CROSSINTERCOM_REQUIRE_HARNESSES", "1" if required else "0")
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(outcome, match="npm is not on PATH"):
        require_harness("pi")
    assert not install.HARNESSES["pi"].executable().exists()
