"""Start the broker in the foreground: single instance, readiness check, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
from pathlib import Path

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import BrokerUnavailable, CrossintercomError
from crossintercom.local_broker.authority import DedupAuthority
from crossintercom.local_broker.logcap import CappedFileHandler, ExtraFormatter
from crossintercom.local_broker.server import Broker
from crossintercom.local_broker.state import BrokerState
from crossintercom.runtime import ensure_runtime_dir, modes, secure_file, secure_tree

log = logging.getLogger(__name__)


def setup_logging(settings: Settings, verbose: bool = False) -> None:
    handler = CappedFileHandler(settings.file("broker.log"))
    handler.setFormatter(ExtraFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def _hold_pid_lock(settings: Settings) -> int:
    """flock broker.pid for the broker's lifetime: the lock, not the file, says who runs."""
    path = settings.file("broker.pid")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, modes(settings)[1])
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise BrokerUnavailable(
            f"a broker is already running for {settings.home} (pid {other or '?'})"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _bind(settings: Settings) -> socket.socket:
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


async def _self_check(path: Path) -> None:
    """Connect once to ourselves so a broken server fails at start, not at the first client."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        writer.write(p.encode({"type": "ping", "request_id": 0}))
        await writer.drain()
        body = await asyncio.wait_for(p.read_frame(reader), 5.0)
        if body is None or p.decode_any(body).get("type") != "pong":
            raise BrokerUnavailable("broker self-check failed")
    finally:
        writer.close()
        await writer.wait_closed()


async def serve(settings: Settings, authority: DedupAuthority, state: BrokerState) -> None:
    broker = Broker(settings, authority, state)
    sock = _bind(settings)
    server = await asyncio.start_unix_server(
        broker.handle_connection, sock=sock, limit=settings.max_frame_bytes + 1024
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, broker.stop)
    housekeeping = loop.create_task(broker.housekeeping())
    try:
        await _self_check(settings.socket_path)
        log.info("broker ready", extra={"pid": os.getpid(), "host_id": settings.host_id})
        secure_tree(settings)  # files made before us (or by another umask) get our modes
        await broker.wait_stopped()
    finally:
        housekeeping.cancel()
        server.close()
        with contextlib.suppress(FileNotFoundError):
            settings.socket_path.unlink()
        for conn in list(broker.conns):
            conn.writer.close()
        await server.wait_closed()


def run_broker(settings: Settings, *, verbose: bool = False) -> None:
    ensure_runtime_dir(settings)
    setup_logging(settings, verbose)
    fd = _hold_pid_lock(settings)
    try:
        file_mode = modes(settings)[1]
        authority = DedupAuthority(
            settings.home,
            max_records=settings.dedup_max_records,
            max_bytes=settings.dedup_max_bytes,
            ttl_s=settings.dedup_ttl_s,
            file_mode=file_mode,
        )
        state = BrokerState(settings.home, file_mode)
        try:
            asyncio.run(serve(settings, authority, state))
        finally:
            state.close()
            authority.close()
            log.info("broker stopped")
    except CrossintercomError as exc:
        log.error("broker failed: %s", exc.message)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)
