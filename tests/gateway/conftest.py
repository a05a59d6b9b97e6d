"""A gateway with TLS (a test CA) on host A of a two-host mailbox, and a "sandbox": its own HOME
and runtime dir, no store, no broker and no socket of A's in reach, only the gateway's port."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from crossintercom import protocol as p
from tests.conftest import CLI, run_cli, wait_for
from tests.pgtls import TlsFiles, make_certificates
from tests.procs import clean_env
from tests.relay.conftest import (
    Cluster,
    Host,
    sqlite_store,  # noqa: F401  (a fixture, found by name)
)


@dataclass
class Gateway:
    host: Host
    proc: subprocess.Popen[str]
    port: int
    certs: TlsFiles
    root: Path
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)
    mcp_port: int | None = None

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"

    def grant(self, name: str, *extra: str) -> str:
        """A token acting as NAME, in a file of its own (as the remote machine keeps it)."""
        made = self.host.cli_json("gateway", "grant", "--as", name, *extra)
        path = self.root / f"token-{made['id']}"
        path.write_text(made["token"] + "\n")
        path.chmod(0o600)
        self.tokens[made["id"]] = made["token"]
        return str(path)

    def sandbox(self, token_file: str, **override: str) -> dict[str, str]:
        """A machine with only HTTPS to the gateway: its own HOME and runtime dir."""
        home = Path(tempfile.mkdtemp(prefix="sbx-", dir=self.root))
        values = {
            "HOME": str(home),
            "CROSSINTERCOM_HOME": str(home / ".crossintercom"),
            "CROSSINTERCOM_HOST_ID": self.host.host_id,
            "CROSSINTERCOM_GATEWAY": self.url,
            "CROSSINTERCOM_GATEWAY_TOKEN_FILE": token_file,
            "CROSSINTERCOM_GATEWAY_CA": str(self.certs.ca),
        }
        return clean_env(**{**values, **override})

    def stop(self) -> str:
        """Stop the gateway; what it logged."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log.read_text()


def start_gateway(
    host: Host, root: Path, certs: TlsFiles, listen: str, *, tls: bool, mcp: bool = False
) -> Gateway:
    ready = root / f"ready-{len(list(root.glob('ready-*')))}"
    cert = ["--cert", str(root / "server.crt"), "--key", str(root / "server.key")] if tls else []
    # MCP on the frames' own port (the harness test gives it a port of its own).
    cert += ["--mcp"] if mcp else []
    # Its log goes to a file: a pipe nobody reads until the end fills, and then the gateway
    # stops at its next log line.
    log = ready.with_name(ready.name.replace("ready", "log"))
    with log.open("w") as err:
        proc = subprocess.Popen(
            [*CLI, "gateway", "serve", "--listen", listen, "--ready-file", str(ready), *cert],
            env=host.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited {proc.returncode}: {log.read_text()}")
        return ready.exists() and ready.read_text().endswith("\n")

    wait_for(listening, 120, "the gateway to listen")
    ports = [int(p) for p in ready.read_text().split()]
    return Gateway(host, proc, ports[0], certs, root, log, mcp_port=ports[0] if mcp else None)


@pytest.fixture
def gateway(sqlite_store: str) -> Iterator[tuple[Gateway, Host, Host]]:  # noqa: F811
    cluster = Cluster(sqlite_store)
    a, b = cluster.up("A", "B")
    root = Path(tempfile.mkdtemp(prefix="gw-", dir=cluster.root))
    certs = make_certificates(root)
    gw = start_gateway(a, root, certs, "127.0.0.1:0", tls=True, mcp=True)
    try:
        yield gw, a, b
    finally:
        log = gw.stop()
        cluster.close()
    for token in gw.tokens.values():  # never in what the gateway logs
        assert token not in log, "a token reached the gateway's log"
    assert "Traceback" not in log, log


def sandbox_json(env: dict[str, str], *args: str, timeout: float = 60) -> tuple[int, Any]:
    """A command in the sandbox with --json: its exit code and parsed output."""
    out = run_cli(env, *args, "--json", timeout=timeout)
    text = out.stdout.strip() or out.stderr.strip()
    try:
        return out.returncode, json.loads(text.splitlines()[-1] if "\n" in text else text)
    except ValueError:
        raise AssertionError((out.returncode, out.stdout, out.stderr)) from None


class Frames:
    """The gateway's WebSocket as a test holds it: asyncio's client, run on a loop in a thread
    of its own. (websockets' sync client reads and writes one TLS object from two threads; a
    request written while its reader takes TLS 1.3's session tickets was sometimes never sent,
    and the gateway rightly dropped the silent connection after ``HEAD_S``.)"""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    def send(self, message: bytes | str) -> None:
        _run(self.ws.send(message))

    def recv(self, timeout: float) -> bytes | str:
        return _run(asyncio.wait_for(self.ws.recv(), timeout), timeout + 5)

    def __enter__(self) -> Frames:
        return self

    def __exit__(self, *exc: object) -> None:
        _run(self.ws.close())


T = TypeVar("T")


@functools.cache
def _loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="ws-client", daemon=True).start()
    return loop


def _run(coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
    return asyncio.run_coroutine_threadsafe(coro, _loop()).result(timeout)


def open_frames(
    port: int, token: str, *, address: str = "127.0.0.1", ca: Path | None = None
) -> Frames:
    """The gateway's WebSocket, opened by hand with TOKEN (raises ``InvalidStatus`` when it is
    refused)."""
    scheme = "wss" if ca is not None else "ws"
    ctx = ssl.create_default_context(cafile=str(ca)) if ca is not None else None

    async def opening() -> ClientConnection:
        return await connect(
            f"{scheme}://{address}:{port}/v1/frames",
            ssl=ctx,
            server_hostname="localhost" if ca is not None else None,
            additional_headers={"Authorization": f"Bearer {token}"} if token else None,
            proxy=None,
            open_timeout=30,
            max_size=None,
        )

    return Frames(_run(opening()))


def hostile(
    port: int,
    token: str,
    *frames: bytes | str,
    address: str = "127.0.0.1",
    ca: Path | None = None,
) -> tuple[int, bytes]:
    """A client speaking the gateway's WebSocket itself (as a hostile client would), sending
    FRAMES, one a message (a frame's body; a str as a text message): the handshake's HTTP
    status, and what the gateway sent until it closed the connection (a refusal's body, or the
    frames' bodies one after another)."""
    try:
        ws = open_frames(port, token, address=address, ca=ca)
    except InvalidStatus as exc:
        return exc.response.status_code, bytes(exc.response.body or b"")
    got = b""
    with ws, contextlib.suppress(ConnectionClosed):
        for frame in frames:
            ws.send(frame if isinstance(frame, str) else frame[p.HEADER.size :])
        while True:
            message = ws.recv(timeout=30)
            got += message if isinstance(message, bytes) else message.encode()
    return 101, got
