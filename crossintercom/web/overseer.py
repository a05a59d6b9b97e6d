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
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal, Unpack

from crossintercom import history
from crossintercom.client import (
    AsyncClient,
    Identity,
    Marks,
    dead_letter_json,
    dead_letters,
    reservation_json,
    reservations,
)
from crossintercom.config import Settings
from crossintercom.errors import CrossintercomError, InboxUnavailable, StoreError, UsageError
from crossintercom.exits import result_exit_code
from crossintercom.inbox import trouble
from crossintercom.models import Outcome, SendResult
from crossintercom.search_model import SearchQuery
from crossintercom.storage import (
    ArchivedMessage,
    ArchiveStore,
    MailboxStore,
    open_store,
)
from crossintercom.storage.connection import connection_url
from crossintercom.storage.poolers import require_own_session
from crossintercom.web import attention, sources
from crossintercom.web.feedstore import FeedStore, Filters
from crossintercom.web.hosts import HostLeases
from crossintercom.web.sources import Item, message_json, receipt

log = logging.getLogger(__name__)

FEED_POLL_S = 0.5
ROSTER_EVERY_S = 2.0
# What a fresh page is given at once; older ones it pages back to (``/api/feed?before=``).
FIRST_PAGE = 100
ARCHIVE_BATCH = 1000
# The archive feed re-reads this far below its cursor: sequence values commit out of order.
FEED_OVERLAP = 500
# Asks whose timeouts the page keeps (its own, this host's sessions' and, with the archive on,
# every host's), the newest.
ASK_TIMEOUTS_KEEP = 5000
# Of the newest messages held, those whose receipts may still move are re-read from the archive
# with the roster (a later receipt changes a row the feed's cursor has passed).
RECEIPTS_RECHECK = 2000

Mode = Literal["send", "ask", "reply"]


class Overseer:
    def __init__(
        self,
        settings: Settings,
        as_name: str,
        *,
        queued_after: float = 60.0,
        drop_after: float = 86_400.0,
    ) -> None:
        self.settings = settings
        self.name = as_name
        self.identity = Identity.named(settings, as_name, status="overseer (web)")
        self.client = AsyncClient(settings, self.identity, mode="own", spawn=True, reconnect=True)
        self.store: MailboxStore | None = None
        self.archive: ArchiveStore | None = None
        self.archive_on = False
        self.hosts = HostLeases(settings.lease_s, settings.heartbeat_s, drop_after)
        self.feed = FeedStore()
        self._cursor = 0
        self._traffic_after = 0
        self._inboxes = sources.InboxReader(settings.inbox_dir, settings.host_id)
        self._subscribers: set[asyncio.Queue[tuple[str, Any]]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.ask_timeouts: dict[str, float] = {}
        self.queued_after = queued_after
        self.attention: list[dict[str, Any]] = []
        self.roster: dict[str, Any] = {"hosts": [], "sessions": [], "warnings": []}

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.client.connect()
        url = connection_url(self.settings)
        if url is not None:
            # The feed's statements are prepared on the server: a shared session loses them.
            await asyncio.to_thread(require_own_session, url)
            self.store = await open_store(url)
            self.archive = self.store.archive
        await self._refresh_archive_state()
        await self._poll_feed()
        await self._refresh_roster()
        self._refresh_attention()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._feed_loop()), loop.create_task(self._mail_loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.client.close()
        if self.store is not None:
            await self.store.aclose()

    # --- the live feed --------------------------------------------------------------------------

    async def subscribe(self) -> AsyncIterator[tuple[str, Any]]:
        """Events for one page: ``message`` (a message object), ``roster``, ``attention``."""
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(1000)
        self._subscribers.add(queue)
        try:
            yield "roster", self.roster
            yield "attention", self.attention
            while True:
                kind, data = await queue.get()
                yield kind, data
                if kind == "bye":
                    return
        finally:
            self._subscribers.discard(queue)

    def closing(self) -> None:
        """The server stops: every page's event stream says so and ends."""
        for queue in list(self._subscribers):
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()  # a stalled page loses one event, not the goodbye
            queue.put_nowait(("bye", None))

    def _publish(self, kind: str, data: Any) -> None:
        for queue in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):  # a stalled page misses events only
                queue.put_nowait((kind, data))

    def _merge(self, items: list[Item]) -> None:
        for mid, message, receipts in items:
            merged = self.feed.merge(mid, message, receipts)
            if merged is not None:
                self._publish("message", self.feed.view(merged))

    def message(self, mid: str) -> dict[str, Any] | None:
        m = self.feed.get(mid)
        return self.feed.view(m) if m is not None else None

    def page(self, before: str | None, limit: int, filters: Filters) -> dict[str, Any]:
        items, more = self.feed.page(before, limit, filters)
        return {"messages": [self.feed.view(m) for m in items], "before": more}

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
                    await self._refresh_receipts()
                self._refresh_attention()
            except (CrossintercomError, OSError) as exc:
                log.warning("overseer refresh failed: %s", exc)

    async def _mail_loop(self) -> None:
        """Mail for the human session: saved by the client, shown on the page."""
        while True:
            got = await self.client.incoming.get()
            if got.message is not None:
                mine = receipt(
                    Outcome.DELIVERED, self.identity.id, self.settings.host_id, self.name
                )
                self._merge([(got.message.id, message_json(got.message), [mine])])

    async def _refresh_archive_state(self) -> None:
        if self.archive is None:
            return
        try:
            state = await self.archive.archive_settings()
        except StoreError as exc:
            log.warning("archive unreadable: %s", exc.message)
            return
        self.archive_on = state.enabled

    async def _poll_feed(self) -> None:
        """The broker's traffic log (this host), then the inboxes (mail from before the broker
        started), then the archive when it is on (every host)."""
        log_ = await self.client.traffic(self._traffic_after)
        if log_.last < self._traffic_after:
            self._traffic_after = 0  # the broker restarted: its log starts again
        else:
            self._traffic_after = max(self._traffic_after, log_.last)
        self._merge(sources.from_traffic(log_.events))
        # An ask's wait: its client's (this host's sessions), or as the archive has it.
        waits = {e.id: e.wait_s for e in log_.events if e.wait_s is not None}
        items = await asyncio.to_thread(self._inboxes.read)  # files of this host
        archived = await self._read_archive()
        waits.update((r.message.id, r.wait_s) for r in archived if r.wait_s is not None)
        for mid, wait_s in waits.items():
            self.ask_timeouts.setdefault(mid, wait_s)
        while len(self.ask_timeouts) > ASK_TIMEOUTS_KEEP:  # oldest first: a bound
            del self.ask_timeouts[next(iter(self.ask_timeouts))]
        self._merge(items + sources.from_archive(archived))

    async def _read_archive(self) -> list[ArchivedMessage]:
        rows: list[ArchivedMessage] = []
        if self.archive is not None and self.archive_on:
            after = max(0, self._cursor - FEED_OVERLAP)
            rows = await self.archive.feed(after, limit=ARCHIVE_BATCH)
            if rows:
                self._cursor = max(self._cursor, rows[-1].seq)
        return rows

    async def _refresh_receipts(self) -> None:
        """Receipts the archive learnt after the page read their messages (``shown`` from a
        recipient's host, a queued message delivered): docs/web.md."""
        if self.archive is None or not self.archive_on:
            return
        ids = sources.unsettled(self.feed.newest(RECEIPTS_RECHECK))
        if not ids:
            return
        try:
            found = await self.archive.receipts_of(ids)
        except StoreError as exc:
            log.warning("archive unreadable: %s", exc.message)
            return
        self._merge([(mid, None, sources.archived_receipts(rs)) for mid, rs in found.items()])

    def _refresh_attention(self) -> None:
        found = attention.attention(
            [self.feed.view(m) for m in self.feed.newest(attention.SCAN)],
            self.roster,
            self.identity.id,
            self.ask_timeouts,
            queued_after=self.queued_after,
        )
        # Ages move on every poll; the page computes them itself, so only the rest counts.
        if _settled(found) != _settled(self.attention):
            self.attention = found
            self._publish("attention", found)
        else:
            self.attention = found

    # --- hosts and sessions ---------------------------------------------------------------------

    def inbox_trouble(self) -> InboxUnavailable | None:
        """Why the human session's inbox fails now, if it does (docs/web.md)."""
        return trouble(lambda: self.client.inbox)

    async def _refresh_roster(self) -> None:
        sessions = await self.client.list_sessions()
        report = await self.client.status()
        warnings = list(report.warnings)
        if report.relay.store is not None and "REFUSED:" in report.relay.store:
            # The relay writes nothing to the store (its locks do not exclude across hosts).
            warnings.append(report.relay.store)
        hosts: dict[str, dict[str, Any]] = {}
        dropped: set[str] = set()
        if self.store is not None:
            try:
                rows = await self.store.hosts()
            except StoreError as exc:
                log.warning("hosts unreadable: %s", exc.message)
                rows = []
            listed, dropped = self.hosts.view(rows, time.time())
            hosts = {h["host"]: h for h in listed}
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
            if s.host in dropped:
                continue
            hosts.setdefault(
                s.host, {"host": s.host, "generation": None, "heartbeat": None, "lease": "unknown"}
            )
        for s in sessions:
            self.feed.names[s.id] = (s.display_name, s.host)
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
        if self.archive is not None and self.archive_on:
            rows = await self.archive.thread(thread_id)
            self._merge(sources.from_archive(rows))
        return [self.feed.view(m) for m in self.feed.thread(thread_id)]

    async def search(self, query: SearchQuery) -> dict[str, Any]:
        """The archive when it is on, and this host's inboxes always: mail received before the
        archive was turned on is found too."""
        inbox = await history.search(self.settings, query, None)
        if not self.archive_on or self.archive is None:
            return {"source": "inbox", "hits": [h.to_json() for h in inbox.hits]}
        archived = await history.search(self.settings, query, self.archive)
        hits = {h.message.id: h for h in inbox.hits} | {h.message.id: h for h in archived.hits}
        ranked = sorted(hits.values(), key=lambda h: -h.score)[: query.limit]
        return {"source": "archive", "hits": [h.to_json() for h in ranked]}

    async def pending(self) -> list[dict[str, Any]]:
        return [m.to_dict() for m in await self.client.pending()]

    async def inbound(self) -> dict[str, dict[str, Any]]:
        """Each session's inbound rules and held mail (docs/agents.md#inbound-policy)."""
        return (await self.client.status()).inbound

    async def reservations(self) -> dict[str, Any]:
        """Every host's live path reservations of every project (docs/agents.md), and whether
        some were left out (``more``: the list is bounded whatever the store holds)."""
        state = await reservations(self.client)
        return {"reservations": [reservation_json(r) for r in state.items], "more": state.more}

    async def dead_letters(self) -> list[dict[str, Any]]:
        """Every session's dead letters on this host (docs/delivery.md#dead-letters)."""
        return [dead_letter_json(d) for d in await dead_letters(self.client, everyone=True)]

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
        **marks: Unpack[Marks],
    ) -> dict[str, Any]:
        """Send, ask or reply as the human session; the CLI's JSON result and exit code."""
        if not text.strip():
            raise UsageError("the message is empty; nothing was sent")
        result: SendResult
        if mode == "reply":
            result = await self.client.reply(
                text, reply_to=reply_to or None, subject=subject, **marks
            )
        elif not to:
            raise UsageError("a send needs a target ('to')")
        elif mode == "ask":
            mid = str(uuid.uuid4())
            self.ask_timeouts[mid] = timeout  # shown with the ask while it waits
            result = await self.client.ask(
                to,
                text,
                timeout=timeout,
                subject=subject,
                thread_id=thread_id,
                message_id=mid,
                **marks,
            )
        else:
            result = await self.client.send(to, text, subject=subject, thread_id=thread_id, **marks)
        out = result.to_dict()
        if mode == "ask":
            out["reply"] = result.reply.to_dict() if result.reply is not None else None
        out["exit_code"] = result_exit_code(result, with_reply=mode == "ask")
        return out


def _settled(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "age_s"} for e in entries]
