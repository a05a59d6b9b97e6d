"""`crossintercom gateway serve`: this host's broker, lent over HTTPS to sessions that cannot
reach a broker of their own (docs/operations.md#gateway, docs/agents.md#through-a-gateway).

One connection per client: TLS, one HTTP/1.1 request ``GET /v1/frames`` with ``Upgrade:
crossintercom-frames`` and ``Authorization: Bearer TOKEN``; once the token is a live grant, the
answer is ``101`` and the connection carries the broker's own frames both ways, to a Unix-socket
connection of the gateway's to the broker. So a remote session is a session of this host with
every guarantee a local one has: the broker queues its mail durably until the remote client has
saved it (and acknowledged it), the client retries with one message id, outcomes are the
broker's.

What a token holder may do is checked frame by frame before the broker sees it: it registers as
the grant's name on this host and nothing else, sends no relay frame, forgets no other session,
reads no host-wide traffic or dead letters. Frames are bounded as on the socket; the broker's
rate limits apply to the session as to any other. A grant revoked or expired ends its
connections within ``RECHECK_S``. Tokens are read from the request head only, and appear in no
log line, answer or process title.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import msgspec

from crossintercom import protocol as p
from crossintercom.client.gateway_link import HEAD_BYTES, HOST_HEADER, PATH, UPGRADE, is_loopback
from crossintercom.config import Settings
from crossintercom.errors import Code, CrossintercomError, ProtocolError, RemoteError
from crossintercom.gateway.tokens import Grant, Grants
from crossintercom.local_broker.process.spawn import ensure_broker
from crossintercom.models import durable_session_id
from crossintercom.runtime import socket_address

log = logging.getLogger(__name__)

HEAD_S = 15.0
# A revoked or expired grant's connections end within this many seconds.
RECHECK_S = 2.0
# Connections one grant may hold at once (a CLI command, a listener, an MCP server ...).
MAX_PER_GRANT = 16
# What a remote session may never send: the relay's frames, host-wide reads, another's end.
_HOST_WIDE = (p.Traffic, p.Counts)
# How a status answer begins on the wire (its tag first): the one broker frame narrowed.
_STATUS = b'{"type":"status"'


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


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Gateway:
    def __init__(self, settings: Settings, listen: Listen) -> None:
        self.settings = settings
        self.listen = listen
        self.tls = listen.context()
        self.grants = Grants(settings)
        self.held: Counter[str] = Counter()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; the port bound (0 asks for any)."""
        await asyncio.to_thread(ensure_broker, self.settings)
        self.server = await asyncio.start_server(
            self._serve, self.listen.host, self.listen.port, ssl=self.tls, limit=HEAD_BYTES * 2
        )
        port = int(self.server.sockets[0].getsockname()[1])
        scheme = "https" if self.tls else "http (loopback clients only)"
        log.info("gateway listening on %s:%d, %s", self.listen.host, port, scheme)
        return port

    async def serve_forever(self) -> None:
        assert self.server is not None
        async with self.server:
            await self.server.serve_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        where = str(peer[0]) if peer else "?"
        grant: Grant | None = None
        try:
            grant = await self._handshake(reader, writer, where)
        except Refused as exc:
            log.info("refused %s: %s", where, exc.code)
            await _answer(writer, exc.status, exc.code, exc.message)
            return
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        self.held[grant.id] += 1
        try:
            await self._tunnel(reader, writer, grant, where)
        finally:
            self.held[grant.id] -= 1
            writer.close()

    async def _handshake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str
    ) -> Grant:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_S)
        if self.tls is None and not is_loopback(where):
            # Without TLS only a proxy on this machine may connect: it ends the TLS. (The head
            # is read first, unused, so the refusal reaches the client before the close.)
            raise Refused(
                403, Code.GATEWAY_PLAIN_HTTP, "plain HTTP is served to loopback addresses only"
            )
        lines = head.decode("latin-1").split("\r\n")
        method, _, rest = lines[0].partition(" ")
        target = rest.split(" ", 1)[0]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method != "GET" or target != PATH or headers.get("upgrade", "").lower() != UPGRADE:
            raise Refused(404, Code.NOT_FOUND, f"this gateway serves GET {PATH} with an upgrade")
        scheme, _, token = headers.get("authorization", "").partition(" ")
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
        writer.write(
            (
                "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                f"Upgrade: {UPGRADE}\r\n{HOST_HEADER}: {self.settings.host_id}\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        log.info("%s connected as %s (grant %s)", where, grant.name, grant.id)
        return grant

    async def _tunnel(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        grant: Grant,
        where: str,
    ) -> None:
        try:
            await asyncio.to_thread(ensure_broker, self.settings)
            with socket_address(self.settings.socket_path) as address:
                b_reader, b_writer = await asyncio.open_unix_connection(address)
        except (OSError, CrossintercomError) as exc:
            log.warning("broker not reachable for %s: %s", where, exc)
            return
        up = asyncio.create_task(self._up(reader, writer, b_writer, grant))
        down = asyncio.create_task(self._down(b_reader, writer, grant.name))
        watch = asyncio.create_task(self._watch(grant))
        try:
            await asyncio.wait({up, down, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down, watch):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            b_writer.close()
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

    async def _down(
        self, broker: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str
    ) -> None:
        """The broker's frames to the remote side; a status answer narrowed (``_narrowed``)."""
        while True:
            try:
                body = await p.read_frame(broker, self.settings.max_frame_bytes)
            except (ProtocolError, OSError, asyncio.IncompleteReadError):
                return
            if body is None:
                return
            if body.startswith(_STATUS):
                body = _narrowed(body, name)
            writer.write(p.HEADER.pack(len(body)) + body)
            await writer.drain()

    async def _up(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        broker: asyncio.StreamWriter,
        grant: Grant,
    ) -> None:
        """The remote side's frames, each checked, to the broker."""
        own = durable_session_id(self.settings.host_id, grant.name)
        limit = self.settings.max_frame_bytes
        while True:
            try:
                length = await p.read_length(reader, limit)
                if length is None:
                    return
                # A body trickled in holds its memory meanwhile: bounded as on the socket.
                body = await asyncio.wait_for(
                    reader.readexactly(length), self.settings.frame_body_s
                )
            except (ProtocolError, OSError, TimeoutError, asyncio.IncompleteReadError):
                return
            refusal = _refusal(body, grant.name, own)
            if refusal is not None:
                code, message, rid = refusal
                log.warning("grant %s sent a refused frame: %s", grant.id, code)
                with contextlib.suppress(OSError):
                    writer.write(p.encode(p.Error(code, message, rid)))
                    await writer.drain()
                return
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


async def _answer(writer: asyncio.StreamWriter, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    reason = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 429: "Too Many Requests"}
    head = (
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        writer.write(head.encode() + body)
        await writer.drain()
    writer.close()


async def serve(
    settings: Settings,
    listen: Listen,
    ready: Path | None = None,
    mcp: Listen | None = None,
    profile: str | None = None,
) -> None:
    """Serve the frames and, with ``mcp``, MCP over streamable HTTP (docs/agents.md); the
    ready file gets the bound ports, one a line."""
    gateway = Gateway(settings, listen)
    ports = [await gateway.start()]
    tasks = [asyncio.create_task(gateway.serve_forever())]
    if mcp is not None:
        port, task = await _serve_mcp(settings, mcp, profile)
        ports.append(port)
        tasks.append(task)
    if ready is not None:
        ready.write_text("".join(f"{p}\n" for p in ports))
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        task.result()


async def _serve_mcp(
    settings: Settings, where: Listen, profile: str | None
) -> tuple[int, asyncio.Task[None]]:
    import uvicorn

    from crossintercom.gateway.mcp_http import McpGateway

    app = McpGateway(settings, where.cert_file is not None, profile)
    config = uvicorn.Config(
        app,
        host=where.host,
        port=where.port,
        ssl_certfile=where.cert_file,
        ssl_keyfile=where.key_file,
        lifespan="off",
        access_log=False,  # the operator's log says who connected, never a header
        log_level="warning",
        # A wake hook's long poll would hold a graceful stop for up to an hour.
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the MCP listener stopped before it started")
        await asyncio.sleep(0.05)
    port = int(server.servers[0].sockets[0].getsockname()[1])
    log.info("MCP over streamable HTTP on %s:%d", where.host, port)
    return port, task
