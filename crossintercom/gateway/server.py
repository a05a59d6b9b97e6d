"""`crossintercom gateway serve`: this host's broker, lent over HTTPS to sessions that cannot
reach a broker of their own (docs/operations.md#gateway, docs/agents.md#through-a-gateway).

One ASGI app, served by uvicorn with the operator's certificate: a WebSocket at ``/v1/frames``
carries the broker's frames (one frame per binary message, both ways) to a Unix-socket
connection of the gateway's to the broker, once ``Authorization: Bearer TOKEN`` names a live
grant (checked before the WebSocket is accepted; a refusal is an HTTP answer with its code).
With MCP on (``--mcp``, ``--mcp-listen``), every other HTTP request goes to the MCP server over
streamable HTTP (gateway/mcp_http.py). So a remote session is a session of this host with
every guarantee a local one has: the broker queues its mail durably until the remote client has
saved it (and acknowledged it), the client retries with one message id, outcomes are the
broker's.

What a token holder may do is checked frame by frame before the broker sees it: it registers as
the grant's name on this host and nothing else, sends no relay frame, forgets no other session,
reads no host-wide traffic or dead letters. Frames are bounded as on the socket; the broker's
rate limits apply to the session as to any other. A grant revoked or expired ends its
connections within ``RECHECK_S``. Tokens are read from the request head only, and appear in no
log line, answer or process title (uvicorn's access log is off).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from starlette.responses import Response
from starlette.routing import Router, WebSocketRoute
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from crossintercom import protocol as p
from crossintercom.client.gateway_link import HOST_HEADER, PATH, is_loopback
from crossintercom.config import Settings
from crossintercom.errors import Code, CrossintercomError, ProtocolError, RemoteError
from crossintercom.gateway.refusals import deny, refusal_body
from crossintercom.gateway.tokens import Grant, Grants
from crossintercom.local_broker.process.spawn import ensure_broker
from crossintercom.models import durable_session_id
from crossintercom.runtime import socket_address

log = logging.getLogger(__name__)

# A connection's first request head (the WebSocket's handshake) is due within this many seconds.
HEAD_S = 15.0
# A revoked or expired grant's connections end within this many seconds.
RECHECK_S = 2.0
# Connections one grant may hold at once (a CLI command, a listener, an MCP server ...).
MAX_PER_GRANT = 16
# What a remote session may never send: the relay's frames, host-wide reads, another's end.
_HOST_WIDE = (p.Traffic, p.Counts)
# How a status answer begins on the wire (its tag first): the one broker frame narrowed.
_STATUS = b'{"type":"status"'
# The WebSocket close codes: the client broke a rule (RFC 6455's policy violation); the
# gateway ends the connection (going away).
_POLICY = 1008
_GOING = 1001


@dataclass(frozen=True, slots=True)
class Listen:
    host: str
    port: int
    cert_file: str | None = None
    key_file: str | None = None

    def context(self) -> ssl.SSLContext | None:
        if not self.cert_file:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def bind(self) -> socket.socket:
        """The listening socket (port 0: any free one); reused at once after a crash."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        return socket.create_server((self.host, self.port), family=family, backlog=2048)


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Gateway:
    """The frames' WebSocket endpoint: admission, then a checked tunnel to the broker."""

    def __init__(self, settings: Settings, tls: bool) -> None:
        self.settings = settings
        self.tls = tls
        self.grants = Grants(settings)
        self.held: Counter[str] = Counter()

    async def frames(self, ws: WebSocket) -> None:
        where = ws.client.host if ws.client else "?"
        try:
            grant = self._admit(ws, where)
        except Refused as exc:
            log.info("refused %s: %s", where, exc.code)
            answer = Response(
                refusal_body(exc.code, exc.message), exc.status, media_type="application/json"
            )
            with contextlib.suppress(Exception):
                await ws.send_denial_response(answer)
            return
        self.held[grant.id] += 1
        try:
            host = self.settings.host_id.encode()
            await ws.accept(headers=[(HOST_HEADER.encode(), host)])
            log.info("%s connected as %s (grant %s)", where, grant.name, grant.id)
            await self._tunnel(ws, grant, where)
        except (OSError, WebSocketDisconnect, RuntimeError):
            pass
        finally:
            self.held[grant.id] -= 1

    def _admit(self, ws: WebSocket, where: str) -> Grant:
        if not self.tls and not is_loopback(where):
            # Without TLS only a proxy on this machine may connect: it ends the TLS.
            raise Refused(
                403, Code.GATEWAY_PLAIN_HTTP, "plain HTTP is served to loopback addresses only"
            )
        scheme, _, token = ws.headers.get("authorization", "").partition(" ")
        try:
            grant = self.grants.check(token.strip() if scheme.lower() == "bearer" else None)
        except RemoteError as exc:
            raise Refused(401, exc.code, exc.message) from None
        except CrossintercomError as exc:
            log.error("grants file: %s", exc.message)
            raise Refused(503, Code.INTERNAL, "the gateway cannot read its grants") from None
        if self.held[grant.id] >= MAX_PER_GRANT:
            raise Refused(
                429, Code.OVER_CAPACITY, f"grant {grant.id} holds {MAX_PER_GRANT} connections"
            )
        return grant

    async def _tunnel(self, ws: WebSocket, grant: Grant, where: str) -> None:
        try:
            await asyncio.to_thread(ensure_broker, self.settings)
            with socket_address(self.settings.socket_path) as address:
                b_reader, b_writer = await asyncio.open_unix_connection(
                    address, limit=self.settings.max_frame_bytes + 1024
                )
        except (OSError, CrossintercomError) as exc:
            log.warning("broker not reachable for %s: %s", where, exc)
            await ws.close(_GOING, "the broker is not reachable")
            return
        up = asyncio.create_task(self._up(ws, b_writer, grant))
        down = asyncio.create_task(self._down(b_reader, ws, grant.name))
        watch = asyncio.create_task(self._watch(grant))
        try:
            await asyncio.wait({up, down, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down, watch):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            b_writer.close()
            with contextlib.suppress(Exception):
                await b_writer.wait_closed()
            broke_rule = up.done() and not up.cancelled() and up.exception() is None and up.result()
            reason = _POLICY if broke_rule or watch.done() else _GOING
            with contextlib.suppress(Exception):
                await ws.close(reason)
            log.info("%s as %s (grant %s) disconnected", where, grant.name, grant.id)

    async def _watch(self, grant: Grant) -> None:
        """End when the grant is revoked or expires."""
        while True:
            await asyncio.sleep(RECHECK_S)
            try:
                await asyncio.to_thread(self.grants.recheck, grant.id)
            except RemoteError as exc:
                log.info("grant %s ended (%s): closing its connection", grant.id, exc.code)
                return

    async def _down(self, broker: asyncio.StreamReader, ws: WebSocket, name: str) -> None:
        """The broker's frames to the remote side, one a message; a status answer narrowed
        (``_narrowed``)."""
        while True:
            try:
                body = await p.read_frame(broker, self.settings.max_frame_bytes)
            except (ProtocolError, OSError, asyncio.IncompleteReadError):
                return
            if body is None:
                return
            if body.startswith(_STATUS):
                body = _narrowed(body, name)
            await ws.send_bytes(body)

    async def _up(self, ws: WebSocket, broker: asyncio.StreamWriter, grant: Grant) -> bool:
        """The remote side's frames, each checked, to the broker; True once one was refused
        (or was not a frame)."""
        own = durable_session_id(self.settings.host_id, grant.name)
        limit = self.settings.max_frame_bytes
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return False
            body = message.get("bytes")
            if body is None or len(body) > limit:
                # Text, or a frame larger than the socket takes (uvicorn's ws_max_size
                # refuses it first): not a frame of this protocol.
                log.warning("grant %s sent what is not a frame", grant.id)
                return True
            refusal = _refusal(body, grant.name, own)
            if refusal is not None:
                code, message_text, rid = refusal
                log.warning("grant %s sent a refused frame: %s", grant.id, code)
                error = p.encode(p.Error(code, message_text, rid))[p.HEADER.size :]
                with contextlib.suppress(Exception):
                    await ws.send_bytes(error)
                return True
            broker.write(p.HEADER.pack(len(body)) + body)
            await broker.drain()


def _refusal(body: bytes, name: str, own: str) -> tuple[str, str, int | None] | None:
    """Why a token holder for NAME may not send this frame, or None (the broker checks the
    rest: a frame that does not decode goes on, to be refused by it with its code)."""
    try:
        frame = p.decode_client_frame(body)
    except ProtocolError:
        return None
    rid = getattr(frame, "request_id", None)
    if isinstance(frame, p.RelayFrame.__args__):
        return Code.GATEWAY_FORBIDDEN_FRAME, "a remote session sends no relay frame", rid
    if isinstance(frame, p.Register):
        session = frame.session
        if (
            session.name != name
            or session.id != own
            or session.purpose != "agent"
            or not session.durable
        ):
            return (
                Code.GATEWAY_WRONG_NAME,
                f"this token acts as {name} (session id {own}) and nothing else",
                rid,
            )
    elif isinstance(frame, p.Forget) and frame.session != own:
        return Code.GATEWAY_WRONG_NAME, f"this token may forget only {name}", rid
    elif isinstance(frame, p.DeadLetters) and frame.everyone:
        return Code.GATEWAY_FORBIDDEN_FRAME, "a remote session reads only its own dead letters", rid
    elif isinstance(frame, _HOST_WIDE):
        return Code.GATEWAY_FORBIDDEN_FRAME, "a remote session reads no host-wide traffic", rid
    return None


def _narrowed(body: bytes, name: str) -> bytes:
    """A status answer as a token holder may read it: the relay link and counts, not the
    host's paths and warnings, its process, nor other sessions' inbound rules."""
    frame = p.decode_broker_frame(body)
    if not isinstance(frame, p.StatusReport):
        return body
    narrowed = msgspec.structs.replace(
        frame,
        pid=0,
        relay=p.RelayState(frame.relay.connected, None),
        warnings=[],
        inbound={k: v for k, v in frame.inbound.items() if k == name},
    )
    return p.encode(narrowed)[p.HEADER.size :]


def build_app(gateway: Gateway, mcp: Any = None) -> Router:
    """The gateway's ASGI app: the frames' WebSocket; every HTTP request to the MCP app (when
    served) or refused ``not_found``."""

    async def other(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if mcp is not None:
                await mcp(scope, receive, send)
            else:
                await deny(send, 404, Code.NOT_FOUND, f"this gateway serves a WebSocket at {PATH}")
        elif scope["type"] == "websocket":
            # Refused before the handshake completes: uvicorn answers it 403.
            await send({"type": "websocket.close", "code": _POLICY})

    return Router([WebSocketRoute(PATH, gateway.frames)], redirect_slashes=False, default=other)


async def serve(
    settings: Settings,
    listen: Listen,
    ready: Path | None = None,
    mcp: Listen | None = None,
    profile: str | None = None,
    *,
    with_mcp: bool = False,
) -> None:
    """Serve the frames and, with ``with_mcp`` or ``mcp``, MCP over streamable HTTP
    (docs/agents.md) on ``listen``, and ``mcp`` too; the ready file gets the bound ports, one a
    line (``listen``'s first)."""
    await asyncio.to_thread(ensure_broker, settings)
    tls = listen.cert_file is not None
    mcp_app = None
    if with_mcp or mcp is not None:
        from crossintercom.gateway.mcp_http import McpGateway

        mcp_app = McpGateway(settings, tls, profile)
    app = build_app(Gateway(settings, tls), mcp_app)
    sockets = [where.bind() for where in (listen, mcp) if where is not None]
    ports = [int(s.getsockname()[1]) for s in sockets]
    scheme = "https" if tls else "http (loopback clients only)"
    for where, port in zip((listen, mcp), ports, strict=False):
        assert where is not None
        log.info("gateway listening on %s:%d, %s", where.host, port, scheme)
    if mcp_app is not None:
        log.info("MCP over streamable HTTP at /mcp")
    task = asyncio.create_task(_uvicorn(settings, app, listen, sockets))
    if ready is not None:
        ready.write_text("".join(f"{port}\n" for port in ports))
    await task


async def _uvicorn(
    settings: Settings, app: Router, listen: Listen, sockets: Sequence[socket.socket]
) -> None:
    import uvicorn

    config = uvicorn.Config(
        app,
        ssl_certfile=listen.cert_file,
        ssl_keyfile=listen.key_file,
        lifespan="off",
        access_log=False,  # the operator's log says who connected, never a header
        log_level="warning",
        # The client's address as the socket has it: plain HTTP is for loopback peers only,
        # whatever a forwarded header claims.
        proxy_headers=False,
        http=_http_protocol(),
        ws="websockets-sansio",
        ws_max_size=settings.max_frame_bytes,
        ws_per_message_deflate=False,
        # A wake hook's long poll would hold a graceful stop for up to an hour.
        timeout_graceful_shutdown=2,
    )
    config.load()
    # TLS 1.2 or later with Python's default ciphers (``Listen.context``), not uvicorn's own.
    config.ssl = listen.context()
    await uvicorn.Server(config).serve(sockets=list(sockets))


def _http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 (h11), with a connection's first request head due within ``HEAD_S``:
    a client that connects and sends nothing, or trickles its head, is dropped (uvicorn bounds
    only the time between requests)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Http(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_due = self.loop.call_later(HEAD_S, self._head_late)

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_due.cancel()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, event: Any) -> None:
            # The WebSocket protocol takes the transport over: this one never sees its end.
            self._head_due.cancel()
            super().handle_websocket_upgrade(event)

        def _head_late(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

    return Http
