"""The client's side of a gateway (client/gateway_link.py) against a WebSocket server of the
test's own, in process (uvicorn): frames written in any cut go out one a message and come back
as frames; a refusal is the error it names, another host's gateway, an unreachable one and a
connection the gateway ends are told as such; and nothing is left open (a socket or transport
left unclosed would be a ResourceWarning, an error here)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from starlette.responses import Response
from starlette.routing import Router, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from crossintercom import protocol as p
from crossintercom.client.gateway_link import HOST_HEADER, open_gateway
from crossintercom.config import ENV_GATEWAY, ENV_GATEWAY_TOKEN_FILE, Settings, load_settings
from crossintercom.errors import BrokerUnavailable, RemoteError, UsageError
from crossintercom.gateway.refusals import refusal_body

LIMIT = 64 * 1024


class FakeGateway:
    """Takes the token ``good`` (this host) or ``elsewhere`` (host Z); echoes each message,
    and ends the connection on ``b"bye"``."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    async def frames(self, ws: WebSocket) -> None:
        token = ws.headers.get("authorization", "")
        if token not in ("Bearer good", "Bearer elsewhere"):
            body = refusal_body("gateway_token_unknown", "no such token")
            await ws.send_denial_response(Response(body, 401, media_type="application/json"))
            return
        host = b"T" if token == "Bearer good" else b"Z"
        await ws.accept(headers=[(HOST_HEADER.encode(), host)])
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                message = await ws.receive_bytes()
                self.messages.append(message)
                if message == b"bye":
                    await ws.close(1001)
                    return
                await ws.send_bytes(message)


@contextlib.asynccontextmanager
async def serving(app: FakeGateway) -> AsyncIterator[int]:
    sock = socket.create_server(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        Router([WebSocketRoute("/v1/frames", app.frames)]),
        lifespan="off",
        log_level="warning",
        ws="websockets-sansio",
    )
    server = uvicorn.Server(config)
    config.load()
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await task


def _settings(tmp_path: Path, port: int, token: str) -> Settings:
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    env = {
        "CROSSINTERCOM_HOME": str(tmp_path / "home"),
        "CROSSINTERCOM_HOST_ID": "T",
        ENV_GATEWAY: f"http://127.0.0.1:{port}",
        ENV_GATEWAY_TOKEN_FILE: str(token_file),
    }
    return load_settings(env)


def _frame(n: int) -> bytes:
    return p.encode(p.Ping(request_id=n))


def test_frames_one_a_message_both_ways(tmp_path: Path) -> None:
    async def run() -> None:
        app = FakeGateway()
        async with serving(app) as port:
            reader, stream = await open_gateway(_settings(tmp_path, port, "good"), LIMIT)
            one, two, three = _frame(1), _frame(2), _frame(3)
            # Two frames and a piece of a third in one write, its rest in another.
            stream.write(one + two + three[:5])
            stream.write(three[5:])
            await stream.drain()
            for sent in (one, two, three):
                assert await p.read_frame(reader, LIMIT) == sent[p.HEADER.size :]
            assert app.messages == [f[p.HEADER.size :] for f in (one, two, three)]
            stream.close()
            await stream.wait_closed()
            assert stream.is_closing()
            assert await p.read_frame(reader, LIMIT) is None

    asyncio.run(run())
    gc.collect()  # a transport left open would warn now


def test_a_connection_the_gateway_ends(tmp_path: Path) -> None:
    async def run() -> None:
        async with serving(FakeGateway()) as port:
            reader, stream = await open_gateway(_settings(tmp_path, port, "good"), LIMIT)
            stream.write(p.HEADER.pack(3) + b"bye")
            assert await p.read_frame(reader, LIMIT) is None
            await stream.wait_closed()
            assert stream.is_closing()
            with pytest.raises(ConnectionResetError):
                stream.write(_frame(4))
            with pytest.raises(ConnectionResetError):
                await stream.drain()

    asyncio.run(run())
    gc.collect()  # a transport left open would warn now


def test_refused_another_host_and_unreachable(tmp_path: Path) -> None:
    async def run() -> None:
        async with serving(FakeGateway()) as port:
            with pytest.raises(RemoteError) as refused:
                await open_gateway(_settings(tmp_path, port, "cig_nothing"), LIMIT)
            assert refused.value.code == "gateway_token_unknown"
            with pytest.raises(UsageError, match="CROSSINTERCOM_HOST_ID=Z"):
                await open_gateway(_settings(tmp_path, port, "elsewhere"), LIMIT)
        with pytest.raises(BrokerUnavailable):
            await open_gateway(_settings(tmp_path, port, "good"), LIMIT)

    asyncio.run(run())
    gc.collect()  # a transport left open would warn now
