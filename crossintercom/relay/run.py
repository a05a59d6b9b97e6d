"""The relay as a process: one per host id per machine (a lock in the runtime dir), the store
opened patiently (a database may still be starting), run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import tenacity

from crossintercom.config import ENV_STORE, Settings
from crossintercom.errors import StoreUnavailable
from crossintercom.relay import syncguard
from crossintercom.relay.service import Relay, RelayError, RelayInUse
from crossintercom.runtime import LockHeld, ensure_runtime_dir, hold_pid_lock
from crossintercom.storage import ArchiveStore, MailboxStore, mask_url, open_archive, open_store
from crossintercom.storage.urls import with_password_file

log = logging.getLogger(__name__)


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
    settings: Settings, *, polling_observer: bool = False, require_sync: bool = False
) -> None:
    """`crossintercom relay`: run until SIGTERM/SIGINT; raises a clear error when it cannot.
    ``require_sync``: only while the store replicates synchronously (relay/syncguard.py)."""
    if not settings.store_url:
        raise RelayError(f"no store configured: pass --store URL or set {ENV_STORE}")
    ensure_runtime_dir(settings)
    lock_fd = hold_relay_lock(settings)
    try:
        url = with_password_file(settings.store_url, settings.store_password_file)
        if require_sync:
            syncguard.check_at_start(url)
        store = _open_store_patiently(url, polling_observer, settings.host_id)
        failed: list[str] = []
        try:
            archive = open_archive(settings.store_url, host_id=settings.host_id)
            asyncio.run(_serve(settings, store, archive, url if require_sync else None, failed))
        finally:
            store.close()
        if failed:
            raise RelayError(failed[0])
    finally:
        os.close(lock_fd)


def _open_store_patiently(url: str, polling_observer: bool, host_id: str) -> MailboxStore:
    """An unreachable store is retried (the database may be starting); a wrong one is not."""
    retrying = tenacity.Retrying(
        wait=tenacity.wait_chain(
            *[tenacity.wait_fixed(w) for w in (1, 2, 5, 10)], tenacity.wait_fixed(30)
        ),
        retry=tenacity.retry_if_exception_type(StoreUnavailable),
        before_sleep=lambda rs: log.warning(
            "store %s unreachable (attempt %d); retrying", mask_url(url), rs.attempt_number
        ),
        reraise=True,
    )
    store: MailboxStore = retrying(
        open_store, url, polling_observer=polling_observer, hot_path=True, host_id=host_id
    )
    return store


async def _serve(
    settings: Settings,
    store: MailboxStore,
    archive: ArchiveStore,
    sync_url: str | None,
    failed: list[str],
) -> None:
    relay = Relay(settings, store, archive)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, relay.stop)
    guard = None
    if sync_url is not None:
        guard = loop.create_task(syncguard.watch(sync_url, relay.stop, failed))
    try:
        await relay.run()
    finally:
        if guard is not None:
            guard.cancel()
