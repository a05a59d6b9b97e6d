"""A mock model server for the real-harness tests: real HTTP on 127.0.0.1 (port 0) in a thread.

It speaks the three wire formats the harnesses use, streaming (SSE) and not:

- Anthropic Messages: ``POST /v1/messages`` (+ ``/v1/messages/count_tokens``), Claude Code, Pi,
  OpenCode's anthropic provider;
- OpenAI Responses: ``POST /v1/responses``, Codex;
- OpenAI Chat Completions: ``POST /v1/chat/completions``, openai-compatible providers;
- ``GET /v1/models`` for all of them.

Use (the ``mock_model`` fixture in conftest.py starts and stops one per test)::

    def script(req: Request) -> Reply:
        send = req.tool_named("crossintercom", "send")
        if send and not req.tool_results:
            return Reply.call(send, to="peer", message="hi")
        return Reply.say("done")

    mock_model.responder = script
    ... run the harness against mock_model.base_url ...
    seen = mock_model.wait_for(lambda r: "hi" in r.all_text(), timeout=20)

A ``Request`` holds the parsed body, its ``api`` ("anthropic", "responses", "chat", "other"),
the ``tool_names`` offered, the ``tool_results`` the model was given, and ``all_text()``: every
string the model was shown (system, messages, tool calls and results; not the tool schemas).
Every request is logged in ``requests`` (all paths, unknown ones too, answered 404). The default
responder answers everything with short text, which also covers the side requests harnesses
make (titles, summaries, quota checks).
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.harnesses import wire

__all__ = ["MockModel", "Reply", "Request", "Responder"]

# Keys of a request body that are not something the model reads as conversation.
_NOT_SHOWN = {"tools", "tool_choice", "model", "metadata", "stream", "stream_options"}
_TOOL_RESULT_TYPES = {"tool_result", "function_call_output", "custom_tool_call_output"}
# Structure, not words: the values of these keys are left out of the text.
_LABELS = {"type", "role", "id", "tool_use_id", "call_id", "status", "signature", "cache_control"}


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in _LABELS:
                yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _walk(value: Any) -> Iterator[dict[str, Any]]:
    """Every dict inside ``value``, depth first."""
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)


def _tools(tools: Any) -> dict[str, tuple[str | None, str]]:
    """Offered tool name -> (namespace, name on the wire). A Responses ``namespace`` entry
    (Codex groups each MCP server's tools in one) lists its members as ``NAMESPACE__NAME``."""
    found: dict[str, tuple[str | None, str]] = {}
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
        if not isinstance(name, str):
            continue
        if tool.get("type") == "namespace":
            for inner, (_, wire_name) in _tools(tool.get("tools")).items():
                found[f"{name}__{inner}"] = (name, wire_name)
        else:
            found[name] = (None, name)
    return found


@dataclass
class Request:
    """One HTTP request the mock received, parsed."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes
    api: str
    at: float = field(default_factory=time.monotonic)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def tool_names(self) -> list[str]:
        return list(_tools(self.body.get("tools")))

    def wire_tool(self, name: str) -> tuple[str | None, str]:
        """(namespace, name) to put in a call of the offered tool ``name``."""
        return _tools(self.body.get("tools")).get(name, (None, name))

    def tool_named(self, *fragments: str) -> str | None:
        """The first offered tool whose name holds every fragment as a whole word
        (case-insensitive): ``send`` is ``crossintercom_send``, never ``..._resend``."""
        words = [re.compile(rf"(?<![a-z0-9]){re.escape(f.lower())}(?![a-z0-9])") for f in fragments]
        for name in self.tool_names:
            if all(w.search(name.lower()) for w in words):
                return name
        return None

    @property
    def tool_results(self) -> list[str]:
        """The text of every tool result in the conversation, in order."""
        shown = {k: v for k, v in self.body.items() if k not in _NOT_SHOWN}
        out = []
        for item in _walk(shown):
            if item.get("type") in _TOOL_RESULT_TYPES or item.get("role") == "tool":
                content = item.get("content", item.get("output"))
                out.append("\n".join(_strings(content)))
        return out

    def all_text(self) -> str:
        """Every string the model was shown, one per line: system, messages, tool calls and
        results (tool schemas and structural labels such as roles and ids left out)."""
        return "\n".join(_strings({k: v for k, v in self.body.items() if k not in _NOT_SHOWN}))


@dataclass(frozen=True)
class Reply:
    """What the model answers: text, or one tool call (``tool`` with ``arguments``)."""

    text: str = ""
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def say(cls, text: str) -> Reply:
        return cls(text=text)

    @classmethod
    def call(cls, tool: str, **arguments: Any) -> Reply:
        return cls(tool=tool, arguments=arguments)


Responder = Callable[[Request], Reply]


def default_responder(req: Request) -> Reply:
    return Reply.say("ok")


ENCODERS = {"anthropic": wire.anthropic, "responses": wire.responses, "chat": wire.chat}


def _api(method: str, path: str) -> str:
    if method == "POST" and path.endswith("/messages"):
        return "anthropic"
    if method == "POST" and path.endswith("/responses"):
        return "responses"
    if method == "POST" and path.endswith("/chat/completions"):
        return "chat"
    return "other"


class MockModel:
    """The server. ``base_url`` is ``http://127.0.0.1:PORT`` (OpenAI clients want ``/v1``)."""

    def __init__(self) -> None:
        self.responder: Responder = default_responder
        self.requests: list[Request] = []
        # Exceptions the responder raised (each answered 500); the fixture fails the test on any.
        self.errors: list[Exception] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MockModel:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> MockModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self, req: Request) -> None:
        with self._lock:
            self.requests.append(req)

    def model_requests(self) -> list[Request]:
        """The logged requests that asked the model for a turn (any of the three formats)."""
        with self._lock:
            return [r for r in self.requests if r.api != "other"]

    def wait_for(
        self, predicate: Callable[[Request], Any], timeout: float = 30, after: int = 0
    ) -> Request:
        """The first logged request from index ``after`` on that matches; polls until
        ``timeout``, then fails listing what was seen."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                seen = self.requests[after:]
            for req in seen:
                if predicate(req):
                    return req
            if time.monotonic() > deadline:
                got = [(r.method, r.path, r.api) for r in seen]
                raise AssertionError(f"no matching model request in {timeout}s; got {got}")
            time.sleep(0.05)

    def answer(self, req: Request) -> tuple[int, str, bytes]:
        rid = f"{next(self._ids):06d}"
        if req.api == "other":
            if req.path.endswith("/count_tokens"):
                return 200, "application/json", b'{"input_tokens": %d}' % max(1, len(req.raw) // 4)
            if req.method == "GET" and req.path.rstrip("/").endswith("/models"):
                return 200, "application/json", json.dumps(wire.MODELS).encode()
            error = {"type": "error", "error": {"type": "not_found_error", "message": req.path}}
            return 404, "application/json", json.dumps(error).encode()
        try:
            reply = self.responder(req)
        except Exception as exc:  # the test reads it from ``errors``; the harness sees a 500
            with self._lock:
                self.errors.append(exc)
            error = {"type": "error", "error": {"type": "api_error", "message": repr(exc)}}
            return 500, "application/json", json.dumps(error).encode()
        encode = {"anthropic": wire.anthropic, "responses": wire.responses, "chat": wire.chat}[
            req.api
        ]
        return (200, *encode(req, reply, rid))


def _decode(raw: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    return raw


def _handler(model: MockModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the request log is ``model.requests``

        def _read(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(parts)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _serve(self) -> None:
            raw = _decode(self._read(), self.headers.get("Content-Encoding", "").lower())
            path = self.path.partition("?")[0]
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            req = Request(
                method=self.command,
                path=path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body if isinstance(body, dict) else {},
                raw=raw,
                api=_api(self.command, path),
            )
            model.log(req)
            status, ctype, payload = model.answer(req)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            if ctype == "text/event-stream":
                self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _serve

    return Handler
