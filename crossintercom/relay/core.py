"""What the relay's parts share: the store, the broker client, the fencing generation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from crossintercom.client import AsyncClient
from crossintercom.config import Settings
from crossintercom.models import SessionInfo
from crossintercom.relay.metrics import RelayMetrics
from crossintercom.relay.systemd import Notifier
from crossintercom.storage import MailboxStore
from crossintercom.storage.liveness import effective_lease


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
