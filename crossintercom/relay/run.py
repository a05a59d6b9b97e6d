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
from crossintercom.storage import MailboxStore, mask_url, open_archive, open_store
from crossintercom.storage.connection import connection_url, tls_refused
from crossintercom.storage.poolers import require_own_session

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
        failed: list[str] = []
        asyncio.run(_serve(settings, polling_observer, require_sync, failed))
        if failed:
            raise RelayError(failed[0])
    finally:
        os.close(lock_fd)


async def _open_store_patiently(url: str, polling_observer: bool, host_id: str) -> MailboxStore:
    """An unreachable store is retried (the database may be starting); a wrong one is not."""
    retrying = tenacity.AsyncRetrying(
        wait=tenacity.wait_chain(
            *[tenacity.wait_fixed(w) for w in (1, 2, 5, 10)], tenacity.wait_fixed(30)
        ),
        # A TLS set-up the server refuses (wrong CA, no client certificate) is a mistake to
        # report now, not an outage to wait out (docs/operations.md, "TLS").
        retry=tenacity.retry_if_exception(
            lambda exc: isinstance(exc, StoreUnavailable) and not tls_refused(exc)
        ),
        before_sleep=lambda rs: log.warning(
            "%s (attempt %d); retrying",
            rs.outcome.exception() if rs.outcome else f"store {mask_url(url)} unreachable",
            rs.attempt_number,
        ),
        reraise=True,
    )

    async def open_checked() -> MailboxStore:
        # A pooler that shares sessions would lose LISTEN wake-ups and prepared statements.
        await asyncio.to_thread(require_own_session, url)
        return await open_store(url, polling_observer=polling_observer, host_id=host_id)

    store: MailboxStore = await retrying(open_checked)
    return store


async def _serve(
    settings: Settings, polling_observer: bool, require_sync: bool, failed: list[str]
) -> None:
    """The store is opened on this loop, the relay's: its operations run here and only here.
    ``require_sync``: run only while the server replicates synchronously (``syncguard``)."""
    url = connection_url(settings)
    assert url is not None
    if require_sync:
        await asyncio.to_thread(syncguard.check_at_start, url)
    store = await _open_store_patiently(url, polling_observer, settings.host_id)
    guard = None
    try:
        archive = open_archive(url, host_id=settings.host_id)
        relay = Relay(settings, store, archive)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, relay.stop)
        if require_sync:
            guard = loop.create_task(syncguard.watch(url, relay.stop, failed))
        await relay.run()
    finally:
        if guard is not None:
            guard.cancel()
        await store.aclose()
