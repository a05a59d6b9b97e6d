"""The relay as a process: one per host id per machine (a lock in the runtime dir), the store
opened patiently (a database may still be starting), run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tenacity

from crossintercom.config import ENV_STORE, Settings
from crossintercom.errors import StoreLocksUnsafe, StoreReadOnly, StoreUnavailable
from crossintercom.relay import lockguard, syncguard
from crossintercom.relay.service import Relay, RelayError, RelayInUse
from crossintercom.relay.systemd import Notifier
from crossintercom.runtime import LockHeld, ensure_runtime_dir, hold_pid_lock
from crossintercom.storage import MailboxStore, mask_url, open_store, parse_store_url
from crossintercom.storage.connection import connection_url, tls_refused
from crossintercom.storage.lockcheck import LockBeacon
from crossintercom.storage.poolers import require_own_session

log = logging.getLogger(__name__)

# `--polling-observer` / `--no-polling-observer` as an environment variable (1 or 0); unset:
# the relay chooses by the store's filesystem (storage/wakeup.py, ``polling_needed``).
ENV_POLLING_OBSERVER = "CROSSINTERCOM_POLLING_OBSERVER"


def polling_from_env(value: str | None) -> bool | None:
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    return None


def hold_relay_lock(settings: Settings) -> int:
    """flock relay.lock: one relay per host id per machine; held until the process ends."""
    try:
        return hold_pid_lock(settings, "relay.lock")
    except LockHeld:
        raise RelayInUse(
            f"a relay is already running for host id {settings.host_id!r} on this machine "
            f"({settings.file('relay.lock')} is locked)"
        ) from None


def run_relay(
    settings: Settings, *, polling_observer: bool | None = None, require_sync: bool = False
) -> None:
    """`crossintercom relay`: run until SIGTERM/SIGINT; raises a clear error when it cannot.
    ``require_sync``: only while the store replicates synchronously (relay/syncguard.py)."""
    if not settings.store_url:
        raise RelayError(f"no store configured: pass --store URL or set {ENV_STORE}")
    ensure_runtime_dir(settings)
    lock_fd = hold_relay_lock(settings)
    try:
        failed: list[str] = []
        _run_to_stop(_serve(settings, polling_observer, require_sync, failed))
        if failed:
            raise RelayError(failed[0])
    finally:
        os.close(lock_fd)
    if stuck := [t for t in threading.enumerate() if t.name.startswith(WORKER_PREFIX)]:
        # A store operation still waits (another writer holds the SQLite file's lock for its
        # whole busy timeout, a network that answers nothing): nothing of it was committed,
        # and a service manager would kill the process at its stop timeout anyway.
        log.warning("stopping without %d store operation(s) still waiting on the store", len(stuck))
        logging.shutdown()
        os._exit(0)


# Worker threads of the relay's loop (asyncio.to_thread: every SQLite transaction). At stop a
# thread stuck on the store gets STOP_GRACE_S to finish, then the process exits without it, so
# SIGTERM ends the relay within a service's stop timeout (15 s) in every state.
WORKER_PREFIX = "relay-worker"
STOP_GRACE_S = 5.0


def _run_to_stop(main: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run(main)``, except that at the end it waits for the worker threads at most
    STOP_GRACE_S instead of for as long as a stuck one takes."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    workers = ThreadPoolExecutor(thread_name_prefix=WORKER_PREFIX)
    loop.set_default_executor(workers)
    try:
        loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            workers.shutdown(wait=False, cancel_futures=True)
            asyncio.set_event_loop(None)
            loop.close()
            end = time.monotonic() + STOP_GRACE_S
            for t in threading.enumerate():
                if t.name.startswith(WORKER_PREFIX):
                    t.join(max(0.0, end - time.monotonic()))


async def _open_store_patiently(
    url: str,
    polling_observer: bool | None,
    host_id: str,
    beacon: LockBeacon | None = None,
    notifier: Notifier | None = None,
) -> MailboxStore:
    """An unreachable store is retried (the database may be starting); a wrong one is not.
    ``beacon``: the SQLite lock check, run before the file is first read (``StoreLocksUnsafe``
    when it refuses); ``notifier``: told while the store is waited for (systemd's status)."""

    def waiting(rs: tenacity.RetryCallState) -> None:
        why = rs.outcome.exception() if rs.outcome else f"store {mask_url(url)} unreachable"
        log.warning("%s (attempt %d); retrying", why, rs.attempt_number)
        if notifier is not None:
            notifier.status(f"waiting for the store: {why}")

    retrying = tenacity.AsyncRetrying(
        wait=tenacity.wait_chain(
            *[tenacity.wait_fixed(w) for w in (1, 2, 5, 10)], tenacity.wait_fixed(30)
        ),
        # A TLS set-up the server refuses (wrong CA, no client certificate) is a mistake to
        # report now, not an outage to wait out (docs/operations.md, "TLS").
        retry=tenacity.retry_if_exception(
            lambda exc: isinstance(exc, StoreUnavailable) and not tls_refused(exc)
        ),
        before_sleep=waiting,
        reraise=True,
    )

    async def open_checked() -> MailboxStore:
        if beacon is not None and not beacon.started:
            # Before the file is even read: a reader that takes a live writer's journal for a
            # crashed one's rolls it back into the store (storage/lockcheck.py).
            try:
                await asyncio.to_thread(beacon.start)
            except FileNotFoundError:
                pass  # no directory for the store yet: opening it says so, and is retried
            except OSError as exc:
                raise StoreReadOnly(
                    f"the lock beacon {beacon.dir} cannot be made or locked "
                    f"({exc.strerror or exc}): the relay checks there that the filesystem "
                    "keeps writers on different hosts apart; let it write in the store's "
                    'directory (docs/operations.md, "Shared filesystems")'
                ) from exc
            if beacon.refused is not None:
                raise StoreLocksUnsafe(beacon.refused)
        # A pooler that shares sessions would lose LISTEN wake-ups and prepared statements.
        await asyncio.to_thread(require_own_session, url)
        return await open_store(url, polling_observer=polling_observer, host_id=host_id)

    store: MailboxStore = await retrying(open_checked)
    return store


async def _serve(
    settings: Settings, polling_observer: bool | None, require_sync: bool, failed: list[str]
) -> None:
    """The store is opened on this loop, the relay's: its operations run here and only here.
    ``require_sync``: run only while the server replicates synchronously (``syncguard``)."""
    url = connection_url(settings)
    assert url is not None
    notifier = Notifier()
    # Fed from this loop from the start: opening a store that is still starting is no hang.
    watchdog = asyncio.get_running_loop().create_task(notifier.feed_watchdog())
    try:
        notifier.status(f"opening the store {mask_url(url)}")
        await _serve_with(settings, url, polling_observer, require_sync, failed, notifier)
    finally:
        watchdog.cancel()
        notifier.close()


async def _serve_with(
    settings: Settings,
    url: str,
    polling_observer: bool | None,
    require_sync: bool,
    failed: list[str],
    notifier: Notifier,
) -> None:
    if require_sync:
        await asyncio.to_thread(syncguard.check_at_start, url)
    path = parse_store_url(url).path
    beacon = LockBeacon(path, settings.host_id) if path is not None else None
    try:
        try:
            await _relay(settings, url, polling_observer, require_sync, failed, beacon, notifier)
        except Exception:
            if beacon is None or beacon.refused is None:
                raise  # a failure of its own; a refusal's is said below
        if beacon is not None and beacon.refused is not None:
            await _refuse(settings, url, beacon, notifier)
    finally:
        if beacon is not None:
            beacon.close()


async def _refuse(settings: Settings, url: str, beacon: LockBeacon, notifier: Notifier) -> None:
    """Serve the broker as a relay that writes nothing (``lockguard``) until SIGTERM/SIGINT."""
    assert beacon.refused is not None
    log.error("%s", beacon.refused)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await lockguard.refuse(settings, mask_url(url), beacon.refused, beacon, stopping, notifier)


async def _relay(
    settings: Settings,
    url: str,
    polling_observer: bool | None,
    require_sync: bool,
    failed: list[str],
    beacon: LockBeacon | None,
    notifier: Notifier,
) -> None:
    try:
        store = await _open_store_patiently(
            url, polling_observer, settings.host_id, beacon, notifier
        )
    except StoreLocksUnsafe:
        return  # the store was never opened
    guards: list[asyncio.Task[None]] = []
    relay: Relay | None = None
    try:
        relay = Relay(settings, store, store.archive)
        relay.notifier = notifier
        if settings.metrics:
            host, port = relay.metrics.serve(settings.metrics)
            log.info("serving metrics on %s:%d", host, port, extra={"port": port})
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, relay.stop)
        if require_sync:
            guards.append(loop.create_task(syncguard.watch(url, relay.stop, failed)))
        if beacon is not None:
            # Found mid-run: the driver already refuses every transaction; the relay stops
            # and a refusing one takes its place (_refuse).
            guards.append(loop.create_task(lockguard.keep_beating(beacon, lambda _: relay.stop())))
        await relay.run()
    finally:
        for guard in guards:
            guard.cancel()
        if relay is not None:
            relay.metrics.close()
        await store.aclose()
