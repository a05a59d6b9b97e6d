"""Run the broker process in the foreground: logging, single instance, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

from crossintercom.config import Settings
from crossintercom.errors import BrokerUnavailable, CrossintercomError
from crossintercom.local_broker.authority import DedupAuthority
from crossintercom.local_broker.broker import Broker
from crossintercom.local_broker.logcap import CappedFileHandler, ExtraFormatter
from crossintercom.local_broker.server import serve
from crossintercom.local_broker.state import BrokerState
from crossintercom.runtime import LockHeld, ensure_runtime_dir, group_gid, hold_pid_lock, modes

log = logging.getLogger(__name__)


def setup_logging(settings: Settings, verbose: bool = False) -> None:
    handler = CappedFileHandler(settings.file("broker.log"), gid=group_gid(settings))
    handler.setFormatter(ExtraFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def _hold_pid_lock(settings: Settings) -> int:
    try:
        return hold_pid_lock(settings, "broker.pid")
    except LockHeld as held:
        raise BrokerUnavailable(
            f"a broker is already running for {settings.home} (pid {held.holder or '?'})"
        ) from None


def _open_files(settings: Settings) -> tuple[DedupAuthority, BrokerState]:
    file_mode = modes(settings)[1]
    authority = DedupAuthority(
        settings.home,
        max_records=settings.dedup_max_records,
        max_bytes=settings.dedup_max_bytes,
        ttl_s=settings.dedup_ttl_s,
        file_mode=file_mode,
        synchronous=settings.sqlite_synchronous,
        wal_max_bytes=settings.wal_max_bytes,
    )
    try:
        state = BrokerState(
            settings.home,
            file_mode,
            synchronous=settings.sqlite_synchronous,
            wal_max_bytes=settings.wal_max_bytes,
        )
    except BaseException:
        authority.close()
        raise
    return authority, state


def _release(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    os.close(fd)


def run_broker(settings: Settings, *, verbose: bool = False) -> None:
    ensure_runtime_dir(settings)
    setup_logging(settings, verbose)
    fd = _hold_pid_lock(settings)
    try:
        authority, state = _open_files(settings)
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
        _release(fd)


async def _take_pid_lock(settings: Settings, wait_s: float) -> int:
    """The broker's pid lock for a broker hosted in this process. A broker already running
    (auto-spawned by a client before the relay started) is asked to stop (SIGTERM: it finishes
    its shutdown; its clients reconnect to this one) and its lock taken once it is free;
    one that does not stop within ``wait_s`` is a clear refusal."""
    try:
        return hold_pid_lock(settings, "broker.pid")
    except LockHeld as held:
        holder = held.holder
    try:
        os.kill(int(holder), signal.SIGTERM)
    except (ValueError, OSError) as exc:
        raise BrokerUnavailable(
            f"a broker is already running for {settings.home} (pid {holder or '?'}) and "
            f"could not be asked to stop ({exc}); stop it, then start the relay again"
        ) from None
    log.info("asked the running broker (pid %s) to hand over", holder)
    deadline = time.monotonic() + wait_s
    while True:
        await asyncio.sleep(0.05)
        try:
            return hold_pid_lock(settings, "broker.pid")
        except LockHeld:
            if time.monotonic() > deadline:
                raise BrokerUnavailable(
                    f"the broker running for {settings.home} (pid {holder}) did not stop "
                    f"within {wait_s:.0f} s; stop it, then start the relay again"
                ) from None


@contextlib.asynccontextmanager
async def hosted_broker(settings: Settings, *, takeover_s: float = 10.0) -> AsyncIterator[Broker]:
    """The broker in the calling process's event loop, for as long as the block runs
    (`crossintercom relay`, docs/architecture.md, "The broker inside the relay"). Its socket,
    trust rules, files and log are those of a broker process; it never exits idle."""
    ensure_runtime_dir(settings)
    _log_broker_to_file(settings)
    fd = await _take_pid_lock(settings, takeover_s)
    try:
        authority, state = _open_files(settings)
        try:
            ready: asyncio.Future[Broker] = asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(serve(settings, authority, state, hosted=ready.set_result))
            started: list[asyncio.Future[Any]] = [task, ready]
            await asyncio.wait(started, return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():
                task.result()  # its failure at start, raised here
                raise BrokerUnavailable("the broker stopped as it started")
            broker = ready.result()
            try:
                yield broker
            finally:
                broker.stop()
                await task
                log.info("broker stopped")
        finally:
            state.close()
            authority.close()
    finally:
        _release(fd)


def _log_broker_to_file(settings: Settings) -> None:
    """The hosted broker's records go to broker.log, as a broker process's do (and not to the
    relay's stderr)."""
    handler = CappedFileHandler(settings.file("broker.log"), gid=group_gid(settings))
    handler.setFormatter(ExtraFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("crossintercom.local_broker")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
