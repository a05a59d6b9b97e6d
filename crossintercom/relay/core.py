"""What the relay's parts share: the store, the broker client, the fencing generation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from crossintercom.client import AsyncClient
from crossintercom.config import Settings
from crossintercom.errors import CrossintercomError, StoreError
from crossintercom.models import SessionInfo
from crossintercom.relay.logs import mask_secrets
from crossintercom.relay.metrics import RelayMetrics
from crossintercom.relay.systemd import Notifier
from crossintercom.safetext import terminal_line
from crossintercom.storage import MailboxStore
from crossintercom.storage.liveness import effective_lease
from crossintercom.storage.tables import ERROR_CHARS


class RelayCore:
    def __init__(self, settings: Settings, store: MailboxStore) -> None:
        self.settings = settings
        self.host = settings.host_id
        self.store = store
        # Counted always (a few increments per batch), served only with --metrics.
        self.metrics = RelayMetrics(effective_lease(settings.lease_s, settings.heartbeat_s))
        # systemd's notify socket when run as a Type=notify unit (relay.run sets it).
        self.notifier = Notifier({})
        # Taken at start (claim_host); every write is fenced by it.
        self.generation = 0
        self.client: AsyncClient | None = None
        self.local_sessions: list[SessionInfo] = []
        # The other hosts' sessions, from the roster (who may send as which session id).
        self.remote_sessions: list[SessionInfo] = []
        self.stopping = asyncio.Event()
        # Set by a roster hint: another host published its roster (relay.service imports it).
        self.roster_hinted = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reported: str | None = None
        # Found at start and shown for as long as the relay runs (storage trust_warnings).
        self.standing_warnings: list[str] = []
        # The last store error (code, one masked line) and whether the host's row lacks it.
        self.last_error: tuple[str, str] | None = None
        self._error_changed = asyncio.Event()

    def store_operation(self, name: str, seconds: float, error: CrossintercomError | None) -> None:
        """The store's observer: the metrics, and the last error for the host's row."""
        self.metrics.store_operation(name, seconds, error)
        if error is not None:
            said = (str(error.code), terminal_line(mask_secrets(error.message), ERROR_CHARS))
            if said != self.last_error:
                self.last_error = said
                self._error_changed.set()

    async def record_errors(self) -> None:
        """Write the last error into the host's row when it changed (`status --all-hosts`
        shows it): one statement per change, so an idle relay writes nothing, and at most one
        per heartbeat_s while errors keep changing or the write itself fails."""
        recorded: tuple[str, str] | None = None
        while not self.stopping.is_set():
            await self._error_changed.wait()
            self._error_changed.clear()
            said = self.last_error
            if said is None or said == recorded:
                continue
            try:
                if not await self.store.record_error(self.host, self.generation, *said):
                    self.fenced()
                    return
                recorded = said
            except StoreError:
                self._error_changed.set()  # the store is away: written once it is back
            await asyncio.sleep(self.settings.heartbeat_s)

    def report_store(self, problem: str | None) -> None:
        """Show the store's state in `crossintercom status` (the relay's status line): its
        masked URL, and the problem while there is one (a stuck SQLite lock, an outage), then the
        standing warnings."""
        parts = [w for w in (problem, *self.standing_warnings) if w]
        text = self.store.url_masked + (f": {'; '.join(parts)}" if parts else "")
        self.notifier.status(f"host {self.host}, store {text}")
        if text == self._reported or self.client is None:
            return
        self._reported = text
        client = self.client

        async def tell() -> None:
            with contextlib.suppress(Exception):
                await client.set_status(text)

        self.spawn(tell())

    def fenced(self) -> None:
        """A newer relay took over this host id: stop (the relay says why)."""
        self.metrics.state.fenced = True
        self.stopping.set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
