"""The client's way to a broker through a gateway (docs/agents.md#through-a-gateway): a
WebSocket to ``CROSSINTERCOM_GATEWAY``'s ``/v1/frames`` (TLS verified against the CA file or the
system's), the token in its handshake, then the same frames as on the broker's socket, one per
binary message. ``BrokerConnection`` opens it instead of the Unix socket, as a stream
(``GatewayStream``).

The token is read from its file for each connection and written only into the handshake's
``Authorization`` header, over TLS (or plain HTTP to a loopback address, as behind a reverse
proxy on the same machine); it appears in no argument, message or log (the WebSocket library
logs to a logger of its own that says nothing below a warning).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import logging
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import (
    BrokerUnavailable,
    Code,
    CrossintercomError,
    RemoteError,
    UsageError,
)

PATH = "/v1/frames"
CONNECT_S = 15.0
# How long a closing connection waits for the gateway's close (a killed one's never comes).
CLOSE_S = 2.0
# How the gateway names its host in the handshake's answer: a remote session is one of that
# host's.
HOST_HEADER = "crossintercom-host"
# A refusal's body is read up to this size.
REFUSAL_BYTES = 16 * 1024
# Bytes written and not yet sent past which ``drain`` waits, as a socket's high-water mark.
HIGH_WATER = 64 * 1024
_ws_log = logging.getLogger(__name__ + ".websocket")
_ws_log.setLevel(logging.WARNING)  # its debug lines would show the handshake's headers


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(settings: Settings) -> str:
    if not settings.gateway_token_file:
        raise UsageError(
            "CROSSINTERCOM_GATEWAY is set but CROSSINTERCOM_GATEWAY_TOKEN_FILE is not: name the "
            "file holding the token `crossintercom gateway grant` printed"
        )
    try:
        token = Path(settings.gateway_token_file).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the gateway token file: {exc}") from None
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise UsageError("the gateway token file holds no token")
    return token


def client_context(settings: Settings) -> ssl.SSLContext:
    """Verify the gateway as ``verify-full`` does: its chain against the CA file (or the
    system's CAs) and its name against the URL's host."""
    ctx = ssl.create_default_context(cafile=settings.gateway_ca_file or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


async def open_gateway(
    settings: Settings, limit: int
) -> tuple[asyncio.StreamReader, GatewayStream]:
    """A stream of frames to the gateway's broker, once the gateway took the token."""
    url = settings.gateway_url or ""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise UsageError(f"CROSSINTERCOM_GATEWAY must be https://HOST[:PORT], not {url!r}")
    host = parts.hostname
    if parts.scheme == "http" and not is_loopback(host):
        # The token would cross the network in clear.
        raise RemoteError(
            Code.GATEWAY_PLAIN_HTTP,
            f"plain http:// to {host} would send the token in clear; use https://",
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    token = read_token(settings)
    ctx = client_context(settings) if parts.scheme == "https" else None
    scheme = "wss" if parts.scheme == "https" else "ws"
    try:
        ws = await connect(
            f"{scheme}://{parts.netloc}{PATH}",
            ssl=ctx,
            additional_headers={"Authorization": f"Bearer {token}"},
            # Straight to the gateway, as the URL names it.
            proxy=None,
            compression=None,
            max_size=limit,
            open_timeout=CONNECT_S,
            close_timeout=CLOSE_S,
            logger=_ws_log,
        )
    except ssl.SSLCertVerificationError as exc:
        raise RemoteError(
            Code.GATEWAY_UNTRUSTED,
            f"the gateway at {host}:{port} is not trusted: {exc.verify_message}; nothing was sent",
        ) from None
    except InvalidStatus as exc:
        raise _refusal(exc.response.status_code, bytes(exc.response.body or b"")) from None
    except (OSError, TimeoutError, ssl.SSLError, InvalidHandshake) as exc:
        raise BrokerUnavailable(f"cannot reach the gateway at {host}:{port}: {exc}") from None
    gateway_host = ws.response.headers.get(HOST_HEADER) if ws.response is not None else None
    if gateway_host and gateway_host != settings.host_id:
        await ws.close()
        raise UsageError(
            f"this gateway's sessions are sessions of host {gateway_host}: set "
            f"CROSSINTERCOM_HOST_ID={gateway_host}"
        )
    reader = asyncio.StreamReader(limit=limit)
    return reader, GatewayStream(ws, reader)


class GatewayStream:
    """A WebSocket to the gateway as the writer of a frame stream (what ``BrokerConnection``
    and ``Coalescer`` write to), its messages fed to ``reader`` as frames. What is written is
    split into frames, each sent as one binary message, in order."""

    def __init__(self, ws: ClientConnection, reader: asyncio.StreamReader) -> None:
        self._ws = ws
        self._reader = reader
        self._partial = bytearray()
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._closing = False
        self._failed = False
        loop = asyncio.get_running_loop()
        self._sending = loop.create_task(self._send_loop())
        self._receiving = loop.create_task(self._receive_loop())

    def write(self, data: bytes) -> None:
        if self._closing:
            raise ConnectionResetError("the connection to the gateway is closed")
        buf = self._partial
        buf += data
        while len(buf) >= p.HEADER.size:
            (length,) = p.HEADER.unpack_from(buf)
            end = p.HEADER.size + length
            if len(buf) < end:
                break
            self._queue.append(bytes(buf[p.HEADER.size : end]))
            self._queued += length
            del buf[:end]
        self._wake.set()

    async def drain(self) -> None:
        """Raise as a socket's writer does if the connection was lost already (so what was
        just written was not sent); wait while more than ``HIGH_WATER`` bytes are unsent."""
        if self._failed:
            raise ConnectionResetError("the connection to the gateway was lost")
        while self._queued > HIGH_WATER and not self._sending.done():
            self._space.clear()
            await self._space.wait()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Send what is written, then close the WebSocket (``wait_closed`` waits for both)."""
        self._closing = True
        self._wake.set()

    async def wait_closed(self) -> None:
        await asyncio.gather(self._sending, self._receiving, return_exceptions=True)

    async def _send_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._queue:
                    body = self._queue.popleft()
                    self._queued -= len(body)
                    await self._ws.send(body)
                    self._space.set()
                if self._closing:
                    break
        except (ConnectionClosed, OSError):
            self._failed = True
        finally:
            self._closing = True
            self._space.set()
            with contextlib.suppress(Exception):
                await self._ws.close()

    async def _receive_loop(self) -> None:
        try:
            async for message in self._ws:
                if isinstance(message, str):
                    break  # not a frame: the gateway speaks another protocol
                self._reader.feed_data(p.HEADER.pack(len(message)) + message)
        except (ConnectionClosed, OSError):
            pass
        finally:
            self._failed = True
            self._reader.feed_eof()
            self.close()


def _refusal(status: int, body: bytes) -> CrossintercomError:
    """The gateway's refusal as the error it names (``{"error": {"code", "message"}}``); an
    answer that is not one (a proxy's 502) is a gateway not reachable now."""
    try:
        said = msgspec.json.decode(body[:REFUSAL_BYTES], type=_Refusal).error
    except msgspec.DecodeError:
        return BrokerUnavailable(f"the gateway answered HTTP {status}, not an upgrade")
    return RemoteError(said.code, said.message)


class _Said(msgspec.Struct):
    code: str
    message: str


class _Refusal(msgspec.Struct):
    """A refusal's body, as the gateway writes it: ``{"error": {"code", "message"}}``."""

    error: _Said
