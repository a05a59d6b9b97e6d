"""The mock model's answers in each wire format (mockmodel.py picks one per request).

Each encoder turns a ``Reply`` (text, or one tool call) into ``(content_type, body)``: JSON when
the request did not ask for a stream, else the server-sent events that format's clients parse,
in the order the real APIs send them.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.harnesses.mockmodel import Reply, Request

__all__ = ["MODEL", "MODELS", "anthropic", "chat", "responses"]

MODEL = "mock-model"
SSE = "text/event-stream"
JSON = "application/json"

Event = tuple[str | None, dict[str, Any] | str]

# ``GET /v1/models``: the fields Anthropic's and OpenAI's model lists each use, in one answer.
MODELS = {
    "object": "list",
    "data": [
        {
            "id": MODEL,
            "object": "model",
            "type": "model",
            "display_name": "Mock",
            "created": 0,
            "created_at": "2025-01-01T00:00:00Z",
            "owned_by": "mock",
        }
    ],
    "has_more": False,
    "first_id": MODEL,
    "last_id": MODEL,
}


def sse(events: list[Event]) -> bytes:
    chunks = []
    for name, data in events:
        line = data if isinstance(data, str) else json.dumps(data)
        chunks.append((f"event: {name}\n" if name else "") + f"data: {line}\n\n")
    return "".join(chunks).encode()


def _tokens(req: Request) -> int:
    return max(1, len(req.raw) // 4)


def anthropic(req: Request, reply: Reply, rid: str) -> tuple[str, bytes]:
    """Anthropic Messages: message_start, one content block (text or tool_use with its input
    as input_json_delta pieces), message_delta with the stop reason, message_stop."""
    usage = {"input_tokens": _tokens(req), "output_tokens": 5}
    if reply.tool is not None:
        block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{rid}", "name": reply.tool}
        full = {**block, "input": reply.arguments}
        opening = {**block, "input": {}}
        args = json.dumps(reply.arguments)
        mid = len(args) // 2  # two pieces, as the real API splits a tool's input
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in (args[:mid], args[mid:])]
        stop = "tool_use"
    else:
        full = {"type": "text", "text": reply.text}
        opening = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": reply.text}]
        stop = "end_turn"
    message: dict[str, Any] = {
        "id": f"msg_{rid}",
        "type": "message",
        "role": "assistant",
        "model": req.body.get("model", MODEL),
        "content": [full],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
    if not req.stream:
        return JSON, json.dumps(message).encode()
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[Event] = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": opening},
        ),
        ("ping", {"type": "ping"}),
    ]
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d})
        for d in deltas
    ]
    end = {"stop_reason": stop, "stop_sequence": None}
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": end, "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return SSE, sse(events)


def responses(req: Request, reply: Reply, rid: str) -> tuple[str, bytes]:
    """OpenAI Responses: response.created, output_item.added, the deltas, output_item.done
    with the whole item (a message or a function_call), response.completed with usage."""
    tokens = _tokens(req)
    usage = {
        "input_tokens": tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tokens + 5,
    }
    if reply.tool is not None:
        namespace, name = req.wire_tool(reply.tool)
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{rid}",
            "call_id": f"call_{rid}",
            "name": name,
            "arguments": json.dumps(reply.arguments),
            "status": "completed",
        }
        if namespace is not None:
            item["namespace"] = namespace
        added = {**item, "arguments": "", "status": "in_progress"}
        where: dict[str, Any] = {"item_id": item["id"], "output_index": 0}
        deltas: list[dict[str, Any]] = [
            {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
            {
                "type": "response.function_call_arguments.done",
                **where,
                "arguments": item["arguments"],
            },
        ]
    else:
        part = {"type": "output_text", "text": reply.text, "annotations": []}
        item = {
            "type": "message",
            "id": f"msg_{rid}",
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
        added = {**item, "status": "in_progress", "content": []}
        where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        deltas = [
            {"type": "response.content_part.added", **where, "part": {**part, "text": ""}},
            {"type": "response.output_text.delta", **where, "delta": reply.text},
            {"type": "response.output_text.done", **where, "text": reply.text},
            {"type": "response.content_part.done", **where, "part": part},
        ]
    response = {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": int(time.time()),
        "model": req.body.get("model", MODEL),
        "status": "completed",
        "output": [item],
        "usage": usage,
    }
    if not req.stream:
        return JSON, json.dumps(response).encode()
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
        {"type": "response.output_item.added", "output_index": 0, "item": added},
        *deltas,
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return SSE, sse([(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)])


def chat(req: Request, reply: Reply, rid: str) -> tuple[str, bytes]:
    """OpenAI Chat Completions: one chunk with the content or the tool call, one with the
    finish reason, a usage chunk when asked for, then ``[DONE]``."""
    usage = {"prompt_tokens": _tokens(req), "completion_tokens": 5}
    usage["total_tokens"] = usage["prompt_tokens"] + 5
    if reply.tool is not None:
        function = {"name": reply.tool, "arguments": json.dumps(reply.arguments)}
        call = {"id": f"call_{rid}", "type": "function", "function": function}
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        delta: dict[str, Any] = {"role": "assistant", "tool_calls": [{"index": 0, **call}]}
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": reply.text}
        delta = dict(message)
        finish = "stop"
    base = {"id": f"chatcmpl-{rid}", "created": int(time.time()), "model": req.body.get("model")}
    if not req.stream:
        choice = {"index": 0, "message": message, "finish_reason": finish}
        body = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        return JSON, json.dumps(body).encode()
    chunk = {**base, "object": "chat.completion.chunk"}
    events: list[Event] = [
        (None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
    ]
    if (req.body.get("stream_options") or {}).get("include_usage"):
        events.append((None, {**chunk, "choices": [], "usage": usage}))
    events.append((None, "[DONE]"))
    return SSE, sse(events)
