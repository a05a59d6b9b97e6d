"""The gateway's MCP over streamable HTTP (``gateway serve --mcp-listen``): for a harness that
takes a remote MCP server by URL, with nothing of crossintercom installed beside it
(docs/agents.md#mcp-over-http).

Each request to ``/mcp`` carries ``Authorization: Bearer TOKEN``; the grant names the session.
The gateway holds that session here, on its own host (``AgentSession``, its inbox in this host's
runtime dir, as ``crossintercom mcp`` would), and answers with the same MCP server and profile as
on stdio: shown-once, framing and the hand-over budget unchanged. A request without a live
grant is refused with the gateway's codes before the MCP layer sees it; a grant revoked or
expired ends its session within ``RECHECK_S``. Plain HTTP is served to loopback clients only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from mcp.server.transport_security import TransportSecuritySettings

from crossintercom.agents.mcp_server import MailboxServer, build_server
from crossintercom.agents.session import AgentSession
from crossintercom.client import Identity
from crossintercom.client.gateway_link import is_loopback
from crossintercom.config import Settings
from crossintercom.errors import Code, CrossintercomError, RemoteError
from crossintercom.gateway.tokens import Grant, Grants

log = logging.getLogger(__name__)

PATH = "/mcp"
RECHECK_S = 2.0
Scope = dict[str, Any]


@dataclass
class _Held:
    grant: Grant
    session: AgentSession
    server: MailboxServer
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class McpGateway:
    """An ASGI app: the token's session's MCP server, one per grant."""

    def __init__(self, settings: Settings, tls: bool, profile: str | None) -> None:
        self.settings = settings
        self.tls = tls
        self.profile = profile
        self.grants = Grants(settings)
        self.held: dict[str, _Held] = {}
        self._lock = asyncio.Lock()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        client = scope.get("client") or ("", 0)
        if not self.tls and not is_loopback(str(client[0])):
            return await _refuse(send, 403, Code.GATEWAY_PLAIN_HTTP, "plain HTTP: loopback only")
        if scope["path"].rstrip("/") != PATH:
            return await _refuse(send, 404, Code.NOT_FOUND, f"this gateway serves MCP at {PATH}")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        kind, _, token = headers.get("authorization", "").partition(" ")
        try:
            grant = self.grants.check(token.strip() if kind.lower() == "bearer" else None)
        except RemoteError as exc:
            log.info("MCP request from %s refused: %s", client[0], exc.code)
            return await _refuse(send, 401, exc.code, exc.message)
        except CrossintercomError as exc:
            log.error("grants file: %s", exc.message)
            return await _refuse(send, 503, Code.INTERNAL, "the gateway cannot read its grants")
        held = await self._hold(grant)
        await held.server.session_manager.handle_request(scope, receive, send)

    async def _hold(self, grant: Grant) -> _Held:
        async with self._lock:
            held = self.held.get(grant.id)
            if held is not None:
                return held
            identity = Identity.named(self.settings, grant.name, cwd=None)
            session = await AgentSession(self.settings, identity).start()
            server = build_server(session, None, self.profile)
            # The token is the boundary: a remote harness names this host as it reaches it.
            server.streamable_http_app(
                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
            )
            held = _Held(grant, session, server)
            running = asyncio.Event()
            held.tasks.append(asyncio.create_task(_run(server, running)))
            held.tasks.append(asyncio.create_task(self._watch(held)))
            await running.wait()
            self.held[grant.id] = held
            log.info("MCP session %s held for grant %s", grant.name, grant.id)
            return held

    async def _watch(self, held: _Held) -> None:
        while True:
            await asyncio.sleep(RECHECK_S)
            try:
                await asyncio.to_thread(self.grants.recheck, held.grant.id)
            except RemoteError as exc:
                log.info("grant %s ended (%s): its MCP session closes", held.grant.id, exc.code)
                break
        async with self._lock:
            self.held.pop(held.grant.id, None)
        await _close(held, skip=asyncio.current_task())

    async def close(self) -> None:
        for held in list(self.held.values()):
            await _close(held)
        self.held.clear()


async def _run(server: MailboxServer, running: asyncio.Event) -> None:
    async with server.session_manager.run():
        running.set()
        await asyncio.Future()


async def _close(held: _Held, skip: asyncio.Task[Any] | None = None) -> None:
    for task in held.tasks:
        if task is not skip:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    await held.session.close()


async def _refuse(send: Any, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
