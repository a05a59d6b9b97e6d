"""What the overseer page shows and does, apart from HTTP (docs/web.md).

- The human session: ``--as NAME`` on this host, owned by the page for its lifetime, so compose
  sends, asks and replies exactly as the CLI would (same broker, same outcomes), and mail for
  NAME arrives here.
- Sessions of every host from the broker (``list``), hosts and their lease state from the
  store (read-only, judged on this process's own clock like a relay does).
- The live feed: the archive when the store keeps one (every host's messages), else the inboxes
  on this host; polled off the event loop and pushed to every open page (``subscribe``).
- The host's degraded states (``status`` warnings: a full disk, a failing inbox) with the
  roster, shown as a banner; ``inbox_trouble`` says whether the page's own inbox fails now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Literal

from crossintercom import history
from crossintercom.client import AsyncClient, Identity
from crossintercom.config import Settings
from crossintercom.errors import CrossintercomError, InboxUnavailable, StoreError, UsageError
from crossintercom.exits import result_exit_code
from crossintercom.inbox import Inbox, session_ids, trouble
from crossintercom.models import Message, SearchQuery, SendResult
from crossintercom.storage import (
    ArchivedMessage,
    ArchiveStore,
    LeaseTracker,
    MailboxStore,
    open_archive,
    open_store,
)
from crossintercom.storage.connection import connection_url
from crossintercom.storage.poolers import require_own_session

log = logging.getLogger(__name__)

FEED_POLL_S = 0.5
ROSTER_EVERY_S = 2.0
FEED_KEEP = 500
# The archive feed re-reads this far below its cursor: sequence values commit out of order.
FEED_OVERLAP = 500

Mode = Literal["send", "ask", "reply"]


def message_json(msg: Message, recipients: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The CLI's message object, with what the page knows of its recipients (receipts)."""
    return {**msg.to_dict(), "recipients": recipients or []}


class Overseer:
    def __init__(self, settings: Settings, as_name: str) -> None:
        self.settings = settings
        self.name = as_name
        self.identity = Identity.named(settings, as_name, status="overseer (web)")
        self.client = AsyncClient(settings, self.identity, mode="own", spawn=True, reconnect=True)
        self.store: MailboxStore | None = None
        self.archive: ArchiveStore | None = None
        self.archive_on = False
        self.leases = LeaseTracker(settings.lease_s, heartbeat_s=settings.heartbeat_s)
        self.feed: deque[dict[str, Any]] = deque(maxlen=FEED_KEEP)
        self._seen: set[str] = set()
        self._cursor = 0
        self._inbox_seq: dict[str, int] = {}
        self._subscribers: set[asyncio.Queue[tuple[str, Any]]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.roster: dict[str, Any] = {"hosts": [], "sessions": [], "warnings": []}

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.client.connect()
        url = connection_url(self.settings)
        if url is not None:
            # The feed's statements are prepared on the server: a shared session loses them.
            await asyncio.to_thread(require_own_session, url)
            self.store = await open_store(url)
            self.archive = open_archive(url)
        await self._refresh_archive_state()
        await self._poll_feed()
        await self._refresh_roster()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._feed_loop()), loop.create_task(self._mail_loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.client.close()
        if self.archive is not None:
            self.archive.close()
        if self.store is not None:
            await self.store.aclose()

    # --- the live feed --------------------------------------------------------------------------

    async def subscribe(self) -> AsyncIterator[tuple[str, Any]]:
        """Events for one page: ``message`` (a message object) and ``roster``."""
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(1000)
        self._subscribers.add(queue)
        try:
            yield "roster", self.roster
            while True:
                yield await queue.get()
        finally:
            self._subscribers.discard(queue)

    def _publish(self, kind: str, data: Any) -> None:
        for queue in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):  # a stalled page misses events only
                queue.put_nowait((kind, data))

    def _add(self, item: dict[str, Any]) -> None:
        mid = item["id"]
        if mid in self._seen:
            # Known already: the newer copy may carry better receipts.
            for i, old in enumerate(self.feed):
                if old["id"] == mid and old != item:
                    self.feed[i] = item
                    self._publish("message", item)
            return
        self._seen.add(mid)
        self.feed.append(item)
        self._publish("message", item)

    async def _feed_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_roster = loop.time() + ROSTER_EVERY_S
        while True:
            await asyncio.sleep(FEED_POLL_S)
            try:
                await self._poll_feed()
                if loop.time() >= next_roster:
                    next_roster = loop.time() + ROSTER_EVERY_S
                    await self._refresh_archive_state()
                    await self._refresh_roster()
            except (CrossintercomError, OSError) as exc:
                log.warning("overseer refresh failed: %s", exc)

    async def _mail_loop(self) -> None:
        """Mail for the human session: saved by the client, shown on the page."""
        while True:
            got = await self.client.incoming.get()
            if got.message is not None:
                self._add(message_json(got.message))

    async def _refresh_archive_state(self) -> None:
        if self.archive is None:
            return
        try:
            state = await asyncio.to_thread(self.archive.archive_settings)
        except StoreError as exc:
            log.warning("archive unreadable: %s", exc.message)
            return
        self.archive_on = state.enabled

    async def _poll_feed(self) -> None:
        items = await asyncio.to_thread(self._read_new)
        for item in items:
            self._add(item)

    def _read_new(self) -> list[dict[str, Any]]:
        if self.archive is not None and self.archive_on:
            rows = self.archive.feed(max(0, self._cursor - FEED_OVERLAP), limit=FEED_KEEP * 2)
            if rows:
                self._cursor = max(self._cursor, rows[-1].seq)
            return [
                message_json(r.message, _recipients(r))
                for r in rows
                if r.message.id not in self._seen or r.recipients
            ]
        return self._read_inboxes()

    def _read_inboxes(self) -> list[dict[str, Any]]:
        """Without the archive: what sessions on this host received."""
        out: list[dict[str, Any]] = []
        directory = self.settings.inbox_dir
        for sid in session_ids(directory):
            try:
                box = Inbox.view(directory, sid)
            except Exception:
                continue
            try:
                for entry in box.messages_after(self._inbox_seq.get(sid, 0)):
                    self._inbox_seq[sid] = entry.seq
                    with contextlib.suppress(ValueError):
                        msg = Message.from_dict(entry.body)
                        recipient = {
                            "session_id": sid,
                            "host": self.settings.host_id,
                            "name": None,
                            "outcome": "shown" if entry.shown else "delivered",
                            "code": None,
                        }
                        out.append(message_json(msg, [recipient]))
            except Exception as exc:
                log.debug("inbox %s unreadable: %s", sid, exc)
            finally:
                box.close()
        return out

    # --- hosts and sessions ---------------------------------------------------------------------

    def inbox_trouble(self) -> InboxUnavailable | None:
        """Why the human session's inbox fails now, if it does (docs/web.md)."""
        return trouble(lambda: self.client.inbox)

    async def _refresh_roster(self) -> None:
        sessions = await self.client.list_sessions()
        warnings = (await self.client.status()).warnings
        hosts: dict[str, dict[str, Any]] = {}
        if self.store is not None:
            try:
                rows = await self.store.hosts()
            except StoreError as exc:
                log.warning("hosts unreadable: %s", exc.message)
                rows = []
            self.leases.observe(rows)
            for row in rows:
                lease = "lapsed" if self.leases.lapsed(row.host_id) else "held"
                hosts[row.host_id] = {
                    "host": row.host_id,
                    "generation": row.generation,
                    "heartbeat": row.heartbeat,
                    "lease": lease,
                }
        hosts.setdefault(
            self.settings.host_id,
            {
                "host": self.settings.host_id,
                "generation": None,
                "heartbeat": None,
                "lease": "local",
            },
        )
        for s in sessions:
            hosts.setdefault(
                s.host, {"host": s.host, "generation": None, "heartbeat": None, "lease": "unknown"}
            )
        roster = {
            "hosts": sorted(hosts.values(), key=lambda h: str(h["host"])),
            "sessions": [s.to_dict() for s in sessions if s.purpose == "agent"],
            "archive": self.archive_on,
            "me": {"name": self.name, "host": self.settings.host_id, "id": self.identity.id},
            "warnings": warnings,
        }
        if roster != self.roster:
            self.roster = roster
            self._publish("roster", roster)

    # --- reading ----------------------------------------------------------------------------------

    async def thread(self, thread_id: str) -> list[dict[str, Any]]:
        """The thread from the archive, with what the page saw that is not archived yet (mail
        for the human session arrives before its copy is written)."""
        found: dict[str, dict[str, Any]] = {
            m["id"]: m for m in self.feed if (m.get("thread_id") or m["id"]) == thread_id
        }
        if self.archive is not None and self.archive_on:
            rows = await asyncio.to_thread(self.archive.thread, thread_id)
            found.update((r.message.id, message_json(r.message, _recipients(r))) for r in rows)
        return sorted(found.values(), key=lambda m: str(m.get("sent_at")))

    async def search(self, query: SearchQuery) -> dict[str, Any]:
        archive = self.archive if self.archive_on else None
        result = await asyncio.to_thread(history.search, self.settings, query, archive)
        return {"source": result.source, "hits": [h.to_json() for h in result.hits]}

    async def pending(self) -> list[dict[str, Any]]:
        return [m.to_dict() for m in await self.client.pending()]

    # --- compose --------------------------------------------------------------------------------

    async def compose(
        self,
        mode: Mode,
        text: str,
        *,
        to: str | None = None,
        subject: str | None = None,
        thread_id: str | None = None,
        reply_to: str | None = None,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Send, ask or reply as the human session; the CLI's JSON result and exit code."""
        if not text.strip():
            raise UsageError("the message is empty; nothing was sent")
        result: SendResult
        if mode == "reply":
            result = await self.client.reply(text, reply_to=reply_to or None, subject=subject)
        elif not to:
            raise UsageError("a send needs a target ('to')")
        elif mode == "ask":
            result = await self.client.ask(
                to, text, timeout=timeout, subject=subject, thread_id=thread_id
            )
        else:
            result = await self.client.send(to, text, subject=subject, thread_id=thread_id)
        out = result.to_dict()
        if mode == "ask":
            out["reply"] = result.reply.to_dict() if result.reply is not None else None
        out["exit_code"] = result_exit_code(result, with_reply=mode == "ask")
        return out


def _host_without_row(host: str, lease: str) -> dict[str, Any]:
    """A host the store has no row for (no store, or its relay never ran)."""
    return {"host": host, "generation": None, "heartbeat": None, "lease": lease}


def _recipients(row: ArchivedMessage) -> list[dict[str, Any]]:
    return [
        {
            "session_id": x.session_id,
            "host": x.host_id,
            "name": x.name,
            "outcome": x.outcome,
            "code": x.code,
        }
        for x in row.recipients
    ]
