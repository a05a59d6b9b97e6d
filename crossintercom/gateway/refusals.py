"""How the gateway refuses an HTTP request (the frames' handshake, an MCP request): a status
and ``{"error": {"code", "message"}}``, the code one of docs/protocol.md#codes."""

from __future__ import annotations

import json
from typing import Any


def refusal_body(code: str, message: str) -> bytes:
    """A refusal as the gateway answers it over HTTP: ``{"error": {"code", "message"}}``."""
    return json.dumps({"error": {"code": code, "message": message}}).encode()


async def deny(send: Any, status: int, code: str, message: str) -> None:
    """Answer an HTTP request with a refusal (an ASGI ``send``)."""
    body = refusal_body(code, message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
