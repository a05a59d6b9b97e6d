"""What this host's sessions sent and received lately, kept in memory for the overseer page.

Every message the broker handles passes one of a few points: a send or reply (delivered here,
forwarded, or refused), a message handed in from another host, a queued message drained to its
session, and the later receipts (``shown``, ``expired``, receipts from other hosts). Each point
records an event here; the page asks for the events after the last one it saw (``traffic``).

Nothing is written to disk: the log is a ring bounded by count and by characters of text, so a
burst of large messages drops the oldest events and never grows the broker (docs/web.md).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final

from crossintercom import protocol as p
from crossintercom.local_broker.sessions.conn import AckResult
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.models import Message, Outcome, Peer, Receipt, SendResult

KEEP_EVENTS: Final = 5000
KEEP_CHARS: Final = 32_000_000
# What an event costs beyond its text (ids, names, receipts), counted against KEEP_CHARS.
_OVERHEAD: Final = 400


class Traffic:
    def __init__(
        self, registry: Registry, *, keep: int = KEEP_EVENTS, keep_chars: int = KEEP_CHARS
    ) -> None:
        self.registry = registry
        self.keep = keep
        self.keep_chars = keep_chars
        self._events: deque[tuple[p.TrafficEvent, int]] = deque()
        self._chars = 0
        self._seq = itertools.count(1)
        self._ids: dict[str, int] = {}  # message id -> events holding its message
        self._waits: dict[str, float] = {}  # ask id -> its client's wait, until recorded
        # The relay's archive hand-off, which records what it is given here as well.
        self.archive_copy: Callable[[Message, list[Receipt]], None] | None = None

    # --- recording ------------------------------------------------------------------------------

    def wait(self, mid: str, wait_s: float) -> None:
        """An ask's client waits ``wait_s`` for the reply: kept with the ask's event."""
        if len(self._waits) >= self.keep:  # asks that never got recorded: a bound, not a leak
            self._waits.clear()
        self._waits[mid] = wait_s

    def message(self, msg: Message, receipts: Iterable[Receipt]) -> float | None:
        """A message sent from, received by or refused on this host, with its receipts; the
        ask's wait when its client told one (the archive keeps it too)."""
        return self._add(msg.id, [self._receipt(r) for r in receipts], msg)

    def receipts(self, receipts: Iterable[Receipt]) -> None:
        """Later receipts (``shown``, ``expired``, delivered from a queue, from other hosts)."""
        by_id: dict[str, list[p.TrafficReceipt]] = {}
        for r in receipts:
            by_id.setdefault(r.id, []).append(self._receipt(r))
        for mid, items in by_id.items():
            self._add(mid, items, None)

    def refused(self, sender: Peer, body: p.OutgoingBody, result: SendResult) -> None:
        """A send or reply that went nowhere before any recipient was tried (an unknown
        target, a rate limit, a full disk): shown with the sender's own words and the code."""
        if body.id in self._ids:
            return  # its recipients' receipts were recorded as it went
        msg = Message(
            body.id,
            sender,
            to=body.to or "",
            text=body.message,
            reply_to=body.reply_to,
            expects_reply=body.expects_reply,
            subject=body.subject,
            thread_id=body.thread_id,
        )
        self._add(
            body.id,
            [p.TrafficReceipt(result.outcome, code=result.code, message=result.message)],
            msg,
        )

    def acked(self, msg: Message, recipient: str) -> Callable[[asyncio.Future[AckResult]], None]:
        """A done-callback for a queued message's push: ``delivered`` once its session saved
        it (a failed push leaves it queued, which the log already says). Passed on through
        ``archive_copy`` too, so the archive's ``queued`` turns ``delivered`` (docs/web.md)."""

        def done(fut: asyncio.Future[AckResult]) -> None:
            if fut.cancelled() or fut.exception() is not None or fut.result() is not None:
                return
            receipt = Receipt(msg.id, Outcome.DELIVERED, recipient, host=self.registry.host)
            if self.archive_copy is not None:
                self.archive_copy(msg, [receipt])  # recorded here as it passes (``message``)
            else:
                self.receipts([receipt])

        return done

    def _receipt(self, r: Receipt) -> p.TrafficReceipt:
        info = self.registry.snapshot().by_id.get(r.recipient) if r.recipient else None
        host = r.host or (info.host if info is not None else None)
        if host is None and r.recipient is not None and self.registry.is_local(r.recipient):
            host = self.registry.host
        return p.TrafficReceipt(
            r.outcome,
            recipient=r.recipient,
            name=info.display_name if info is not None else None,
            host=host,
            code=r.code,
            message=r.message,
        )

    def _add(self, mid: str, receipts: list[p.TrafficReceipt], msg: Message | None) -> float | None:
        wait_s = self._waits.pop(mid, None) if msg is not None else None
        event = p.TrafficEvent(next(self._seq), round(time.time(), 3), mid, receipts, msg, wait_s)
        cost = _OVERHEAD
        if msg is not None:
            cost += len(msg.text) + sum(len(a.content) for a in msg.attachments)
            self._ids[mid] = self._ids.get(mid, 0) + 1
        self._events.append((event, cost))
        self._chars += cost
        while self._events and (len(self._events) > self.keep or self._chars > self.keep_chars):
            old, old_cost = self._events.popleft()
            self._chars -= old_cost
            if old.message is not None:
                left = self._ids.get(old.id, 1) - 1
                if left:
                    self._ids[old.id] = left
                else:
                    self._ids.pop(old.id, None)
        return wait_s

    # --- reading --------------------------------------------------------------------------------

    def read(self, request_id: int, after: int, limit: int) -> p.TrafficLog:
        first = self._events[0][0].seq if self._events else 0
        last = self._events[-1][0].seq if self._events else 0
        # Events are in seq order: skip what the reader has by position, not by scanning.
        start = max(0, after - first + 1) if first else 0
        out = list(itertools.islice((e for e, _ in self._events), start, start + limit))
        return p.TrafficLog(request_id, out, first, last)
