"""Run the broker process in the foreground: logging, single instance, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from crossintercom.config import Settings
from crossintercom.errors import BrokerUnavailable, CrossintercomError
from crossintercom.local_broker.authority.dedup import DedupAuthority
from crossintercom.local_broker.process.logcap import CappedFileHandler, ExtraFormatter
from crossintercom.local_broker.server.listener import serve
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.runtime import (
    LockHeld,
    ensure_runtime_dir,
    fitted_wal_bytes,
    group_gid,
    hold_pid_lock,
    modes,
    runtime_dir_too_small,
)

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


def run_broker(settings: Settings, *, verbose: bool = False) -> None:
    ensure_runtime_dir(settings)
    setup_logging(settings, verbose)
    fd = _hold_pid_lock(settings)
    if (small := runtime_dir_too_small(settings.home)) is not None:
        log.warning("%s", small)
    # On a filesystem under the minimum the WALs are bounded tighter (runtime.fitted_wal_bytes).
    wal_max_bytes = fitted_wal_bytes(settings.home, settings.wal_max_bytes)
    try:
        file_mode = modes(settings)[1]
        authority = DedupAuthority(
            settings.home,
            max_records=settings.dedup_max_records,
            max_bytes=settings.dedup_max_bytes,
            ttl_s=settings.dedup_ttl_s,
            file_mode=file_mode,
            synchronous=settings.sqlite_synchronous,
            wal_max_bytes=wal_max_bytes,
        )
        state = BrokerState(
            settings.home,
            file_mode,
            synchronous=settings.sqlite_synchronous,
            wal_max_bytes=wal_max_bytes,
        )
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
