"""Running the overseer page: bind, print how to open it, serve with uvicorn until a signal."""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from crossintercom.config import Settings
from crossintercom.errors import UsageError
from crossintercom.runtime import ensure_runtime_dir
from crossintercom.web.app import build_app
from crossintercom.web.auth import Guard, allowed_hosts, load_key, write_token_file
from crossintercom.web.overseer import Overseer

DEFAULT_LISTEN = "127.0.0.1:8765"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); port 0 picks a free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen {value!r}: expected HOST:PORT, such as 127.0.0.1:8765")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


def run_web(
    settings: Settings,
    listen: str,
    as_name: str,
    announce: Callable[[dict[str, str]], None],
    *,
    queued_after: float = 60.0,
    drop_after: float = 86_400.0,
) -> None:
    host, port = parse_listen(listen)
    ensure_runtime_dir(settings)
    sock = bind(host, port)
    port = sock.getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host
    guard = Guard.from_key(load_key(settings.home), allowed_hosts(url_host, port), port)
    token_file = write_token_file(settings.home, guard.token)
    info = {
        "url": f"http://{url_host}:{port}/?token={guard.token}",
        "listen": f"{url_host}:{port}",
        "token_file": str(token_file),
        "as": f"{as_name}@{settings.host_id}",
        "loopback": "yes" if is_loopback(host) else "no",
    }
    # SIGTERM stops the page as Ctrl-C does: uvicorn re-raises the signal it caught once it
    # has shut down, and this handler turns that into the same unwinding, so the token file
    # goes and the human session is closed (docs/web.md).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        make = lambda: Overseer(  # noqa: E731
            settings, as_name, queued_after=queued_after, drop_after=drop_after
        )
        asyncio.run(_serve(make, sock, guard, lambda: announce(info)))
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
        token_file.unlink(missing_ok=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


async def _serve(
    make: Callable[[], Overseer], sock: socket.socket, guard: Guard, announce: Callable[[], None]
) -> None:
    """Register the human session first, so a refusal (the name is in use, no broker) is a
    clear error and not a server that starts and dies; then announce and serve. The overseer
    is made here, inside the event loop that runs it."""
    overseer = make()
    try:
        await overseer.start()
        announce()
        config = uvicorn.Config(
            build_app(overseer, guard, manage_lifecycle=False),
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=2,
            access_log=False,
        )
        await _Server(config, overseer.closing).serve(sockets=[sock])
    finally:
        await overseer.stop()


class _Server(uvicorn.Server):
    """uvicorn's server that, told to exit, first ends the pages' event streams: otherwise it
    waits for them (they never end by themselves) and cancels them with errors logged."""

    def __init__(self, config: uvicorn.Config, closing: Callable[[], None]) -> None:
        super().__init__(config)
        self._closing = closing

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        asyncio.get_running_loop().call_soon_threadsafe(self._closing)
        super().handle_exit(sig, frame)
