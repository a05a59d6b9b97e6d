"""The client's way to a broker through a gateway (docs/agents.md#through-a-gateway): one TLS
connection to ``CROSSINTERCOM_GATEWAY``, an HTTP/1.1 upgrade carrying the token, then the same
frames as on the broker's socket. ``BrokerConnection`` opens it instead of the Unix socket.

The token is read from its file for each connection and written only into the request head, over
TLS (or plain HTTP to a loopback address, as behind a reverse proxy on the same machine); it
appears in no argument, message or log.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

from crossintercom.config import Settings
from crossintercom.errors import (
    BrokerUnavailable,
    Code,
    CrossintercomError,
    RemoteError,
    UsageError,
)

# The upgrade's name (both sides), and the bound on the gateway's answer head.
UPGRADE = "crossintercom-frames"
PATH = "/v1/frames"
HEAD_BYTES = 16 * 1024
CONNECT_S = 15.0
# How the gateway names its host in the answer: a remote session is one of that host's.
HOST_HEADER = "crossintercom-host"


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
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
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
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=ctx, limit=limit), CONNECT_S
        )
    except ssl.SSLCertVerificationError as exc:
        raise RemoteError(
            Code.GATEWAY_UNTRUSTED,
            f"the gateway at {host}:{port} is not trusted: {exc.verify_message}; nothing was sent",
        ) from None
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        raise BrokerUnavailable(f"cannot reach the gateway at {host}:{port}: {exc}") from None
    head = (
        f"GET {PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: Upgrade\r\n"
        f"Upgrade: {UPGRADE}\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    try:
        writer.write(head.encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_S)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        writer.close()
        raise BrokerUnavailable(f"the gateway at {host}:{port} did not answer: {exc}") from None
    status, headers = parse_head(answer)
    if status != 101:
        body = await _body(reader, headers)
        writer.close()
        raise _refusal(status, body)
    gateway_host = headers.get(HOST_HEADER)
    if gateway_host and gateway_host != settings.host_id:
        writer.close()
        raise UsageError(
            f"this gateway's sessions are sessions of host {gateway_host}: set "
            f"CROSSINTERCOM_HOST_ID={gateway_host}"
        )
    return reader, writer


def parse_head(data: bytes) -> tuple[int, dict[str, str]]:
    """The status code and headers (names lower-cased) of an HTTP/1.1 answer head."""
    lines = data.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        return 0, {}
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    try:
        size = min(int(headers.get("content-length", "0")), HEAD_BYTES)
        return await asyncio.wait_for(reader.readexactly(size), CONNECT_S)
    except (ValueError, OSError, TimeoutError, asyncio.IncompleteReadError):
        return b""


def _refusal(status: int, body: bytes) -> CrossintercomError:
    """The gateway's refusal as the error it names (``{"error": {"code", "message"}}``); an
    answer that is not one (a proxy's 502) is a gateway not reachable now."""
    try:
        said = msgspec.json.decode(body, type=_Refusal).error
    except msgspec.DecodeError:
        return BrokerUnavailable(f"the gateway answered HTTP {status}, not an upgrade")
    return RemoteError(said.code, said.message)


class _Said(msgspec.Struct):
    code: str
    message: str


class _Refusal(msgspec.Struct):
    """A refusal's body, as the gateway writes it: ``{"error": {"code", "message"}}``."""

    error: _Said
