"""The broker's Unix socket server: bind, self-check, read frames, hand them to the broker.

A bad frame gets an ``error`` frame with a stable code and the connection stays open; a broken
byte stream (bad length, truncation) closes that connection only (docs/protocol.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from pathlib import Path

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import BrokerUnavailable, Code, ProtocolError
from crossintercom.local_broker.authority.dedup import DedupAuthority
from crossintercom.local_broker.broker import Broker
from crossintercom.local_broker.server import peercred
from crossintercom.local_broker.sessions.conn import Conn
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.runtime import group_gid, secure_file, secure_tree

log = logging.getLogger(__name__)


class Server:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.max_frame = broker.settings.max_frame_bytes
        self.body_s = broker.settings.frame_body_s
        self.group_gid = group_gid(broker.settings)
        # Connections waiting for a frame's body, since when (monotonic): ``cut_slow_bodies``
        # watches them all with one timer. A timeout around each body read (asyncio.wait_for)
        # cost a task and two loop turns per frame even when the body had already arrived,
        # and split every burst the broker read into turns of one frame each, undoing the
        # batching behind it (docs/perf-log/2026-12-07-peer-and-regression.md).
        self.bodies: dict[Conn, float] = {}

    async def handle_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        why = self._refused_peer(writer)
        if why is not None:
            log.warning("connection refused: %s", why, extra={"error": why})
            writer.write(p.encode(p.Error(Code.PEER_NOT_ALLOWED, f"connection refused: {why}")))
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            return
        conn = Conn(reader, writer, max_frame=self.max_frame)
        self.broker.open(conn)
        try:
            await self._serve(conn)
        except Exception:
            log.exception("connection failed", extra={"cid": conn.cid})
        finally:
            self.broker.retire(conn)
            conn.out.flush()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _refused_peer(self, writer: asyncio.StreamWriter) -> str | None:
        sock = writer.get_extra_info("socket")
        if sock is None:
            return "peer credentials unavailable"
        try:
            peer = peercred.peer_of(sock)
        except OSError as exc:
            return f"peer credentials unreadable: {exc}"
        return peercred.refusal(peer, self.group_gid)

    async def cut_slow_bodies(self) -> None:
        """A frame's body must arrive within ``frame_body_s`` of its length: one that has not
        gets ``bad_frame`` and its connection is closed (a trickle would hold the broker's
        memory for it), every such connection checked on one timer."""
        # A quarter of the bound between looks, within 0.05-0.5 s: a tiny bound set in the
        # config must not turn this into a busy loop.
        period = max(0.05, min(self.body_s / 4, 0.5))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn, since in list(self.bodies.items()):
                if now - since >= self.body_s:
                    why = f"a frame's body did not arrive within {self.body_s:g} s of its length"
                    conn.write(p.Error(Code.BAD_FRAME, why))
                    conn.out.flush()
                    conn.writer.close()  # its read ends: _serve returns

    async def _serve(self, conn: Conn) -> None:
        while not conn.closed:
            try:
                length = await p.read_length(conn.reader, self.max_frame)
                if length is None:
                    return
                self.bodies[conn] = time.monotonic()
                try:
                    body = await conn.reader.readexactly(length)
                finally:
                    del self.bodies[conn]
            except p.FrameTooLarge as exc:
                conn.write(p.Error(exc.code, exc.message))
                return
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # a broken byte stream cannot be resynchronised: close it
            try:
                frame = p.decode_client_frame(body)
            except ProtocolError as exc:
                conn.write(p.Error(*self._why_undecodable(conn, body, exc)))
                continue
            request_id = getattr(frame, "request_id", None)
            try:
                await self.broker.dispatch(conn, frame)
            except ProtocolError as exc:
                conn.write(p.Error(exc.code, exc.message, request_id))
            except Exception as exc:
                log.exception("frame handling failed", extra={"type": type(frame).__name__})
                conn.write(p.Error(Code.INTERNAL, f"broker error: {exc}", request_id))

    def _why_undecodable(
        self, conn: Conn, body: bytes, exc: ProtocolError
    ) -> tuple[str, str, int | None]:
        """The error for a frame that did not decode. The gate speaks first: a relay frame
        from anyone but the relay is ``not_relay`` whatever its body holds."""
        request_id = p.request_id_of(body)
        ftype = p.frame_type(body)
        if ftype is not None:
            try:
                self.broker.gate(conn, ftype)
            except ProtocolError as gate:
                if gate.code == Code.NOT_RELAY:
                    return gate.code, gate.message, request_id
        return exc.code, exc.message, request_id


def bind(settings: Settings) -> socket.socket:
    path = settings.socket_path
    # We hold the pid lock, so any socket file left here belongs to a dead broker.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177 if not settings.group else 0o117)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    secure_file(settings, path)
    sock.listen(128)
    return sock


async def self_check(path: Path) -> None:
    """Connect once to ourselves so a broken server fails at start, not at the first client."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(p.encode(p.Ping(request_id=0)))
        await writer.drain()
        body = await asyncio.wait_for(p.read_frame(reader), 5.0)
        if body is None or not isinstance(p.decode_broker_frame(body), p.Pong):
            raise BrokerUnavailable("broker self-check failed")
    finally:
        writer.close()
        await writer.wait_closed()


async def serve(settings: Settings, authority: DedupAuthority, state: BrokerState) -> None:
    broker = Broker(settings, authority, state)
    server = Server(broker)
    # Files made before us (or by another umask) get our modes before the socket listens: a
    # client may count the broker up once a connect succeeds, and a mode changed after that is
    # the caller's, and stays (docs/operations.md).
    secure_tree(settings)
    sock = bind(settings)
    aserver = await asyncio.start_unix_server(
        server.handle_connection, sock=sock, limit=settings.max_frame_bytes + 1024
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, broker.stop)
    housekeeping = loop.create_task(broker.housekeeping())
    cutter = loop.create_task(server.cut_slow_bodies())
    try:
        await self_check(settings.socket_path)
        log.info("broker ready", extra={"pid": os.getpid(), "host_id": settings.host_id})
        await broker.wait_stopped()
    finally:
        housekeeping.cancel()
        cutter.cancel()
        aserver.close()
        with contextlib.suppress(FileNotFoundError):
            settings.socket_path.unlink()
        for conn in list(broker.conns):
            conn.out.flush()
            conn.writer.close()
        await aserver.wait_closed()
