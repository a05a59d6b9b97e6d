"""The page's messages, merged from every source it reads, in time order (docs/web.md).

A message may arrive several times: from the broker's traffic log (sent, received, refused,
later receipts), from an inbox on this host, from the archive. ``merge`` keeps one copy per id
and one receipt per recipient, the furthest along by the one order the archive keeps too
(``models.PROGRESS``: ``queued`` < ``delivered`` < ``shown`` < ``acknowledged``; a failure
ends it). Kept in memory, bounded; ``page`` walks it backwards from a
cursor with filters. ``view`` is what the page gets: names for ids where the roster knows them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from crossintercom.models import Outcome, progress
from crossintercom.web.escalations import ESCALATION_ATTACHMENT, escalation_of

KEEP: Final = 20_000
KINDS: Final = ("message", "ask", "reply", "escalation", "refusal")
# The outcomes the page filters by.
STATES: Final = (
    Outcome.DELIVERED,
    Outcome.QUEUED,
    Outcome.SHOWN,
    Outcome.REFUSED,
    Outcome.EXPIRED,
    Outcome.NOT_SENT,
    Outcome.UNKNOWN,
)


@dataclass(frozen=True, slots=True)
class Filters:
    host: str | None = None
    session: str | None = None
    thread: str | None = None
    state: str | None = None
    kind: str | None = None

    def match(self, m: dict[str, Any]) -> bool:
        rs = m.get("recipients") or []
        if self.thread and (m.get("thread_id") or m["id"]) != self.thread:
            return False
        if self.kind and m.get("kind") != self.kind:
            return False
        if self.state and not any(r.get("outcome") == self.state for r in rs):
            return False
        if (
            self.host
            and m["from"]["host"] != self.host
            and not any(r.get("host") == self.host for r in rs)
        ):
            return False
        if self.session:
            who = {m["from"].get("id"), m["from"].get("name"), m.get("to")}
            who |= {r.get("session_id") for r in rs} | {r.get("name") for r in rs}
            if self.session not in who:
                return False
        return True


def kind_of(m: dict[str, Any]) -> str:
    recipients = m.get("recipients") or []
    if recipients and all(not r.get("session_id") for r in recipients):
        return "refusal"  # went nowhere: no recipient was ever tried
    if any(a.get("name") == ESCALATION_ATTACHMENT for a in m.get("attachments") or []):
        return "escalation"
    if m.get("reply_to"):
        return "reply"
    if m.get("expects_reply"):
        return "ask"
    return "message"


def _key(m: dict[str, Any]) -> tuple[str, str]:
    return (str(m.get("sent_at") or ""), str(m["id"]))


def cursor_of(m: dict[str, Any]) -> str:
    return "|".join(_key(m))


class FeedStore:
    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._by_id: dict[str, dict[str, Any]] = {}
        self._order: list[tuple[str, str]] = []
        self.names: dict[str, tuple[str, str]] = {}  # session id -> (name, host)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, mid: object) -> bool:
        return mid in self._by_id

    def get(self, mid: str) -> dict[str, Any] | None:
        return self._by_id.get(mid)

    def merge(
        self, mid: str, message: dict[str, Any] | None, receipts: Iterable[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """Add what a source knows of message ``mid``; the merged item if anything changed."""
        old = self._by_id.get(mid)
        if old is None:
            if message is None:
                return None  # a receipt for a message this page never saw
            item = {**message, "recipients": []}
            self._by_id[mid] = item
            bisect.insort(self._order, _key(item))
            self._trim()
            changed = True
        else:
            item, changed = old, False
        for r in receipts:
            changed |= _merge_receipt(item["recipients"], r)
        kind = kind_of(item)
        if item.get("kind") != kind:
            item["kind"], changed = kind, True
        return item if changed else None

    def _trim(self) -> None:
        while len(self._order) > self.keep:
            _, mid = self._order.pop(0)
            self._by_id.pop(mid, None)

    def newest(self, n: int) -> list[dict[str, Any]]:
        return [self._by_id[mid] for _, mid in self._order[-n:]]

    def page(
        self, before: str | None, limit: int, filters: Filters
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Up to ``limit`` messages older than ``before`` (newest first) that pass ``filters``,
        and the cursor for the next page (``None``: nothing older)."""
        end = len(self._order)
        if before:
            sent_at, _, mid = before.partition("|")
            end = bisect.bisect_left(self._order, (sent_at, mid))
        out: list[dict[str, Any]] = []
        i = end - 1
        while i >= 0 and len(out) < limit:
            m = self._by_id[self._order[i][1]]
            if filters.match(m):
                out.append(m)
            i -= 1
        more = i >= 0 and len(out) == limit
        return out, (cursor_of(out[-1]) if out and more else None)

    def thread(self, thread_id: str) -> list[dict[str, Any]]:
        return [
            self._by_id[mid]
            for _, mid in self._order
            if (self._by_id[mid].get("thread_id") or mid) == thread_id
        ]

    def all(self) -> Iterable[dict[str, Any]]:
        return (self._by_id[mid] for _, mid in self._order)

    # --- what the page gets -----------------------------------------------------------------

    def view(self, m: dict[str, Any]) -> dict[str, Any]:
        """The item with names where only ids were known (receipts, a reply's target)."""
        recipients = []
        for r in m.get("recipients") or []:
            known = self.names.get(r.get("session_id") or "")
            if known is not None and not r.get("name"):
                recipients.append({**r, "name": known[0], "host": r.get("host") or known[1]})
            else:
                recipients.append(r)
        out = {**m, "recipients": recipients, "cursor": cursor_of(m)}
        if m.get("kind") == "escalation":
            out["escalation"] = escalation_of(m)
        target = self.names.get(m.get("to") or "")
        if target is not None:
            out["to"] = f"{target[0]}@{target[1]}"
        return out


def _merge_receipt(recipients: list[dict[str, Any]], r: dict[str, Any]) -> bool:
    sid = r.get("session_id")
    for i, old in enumerate(recipients):
        if old.get("session_id") != sid:
            continue
        # How far along (models.PROGRESS): a later source never takes a recipient back, and
        # of two failures the first stays (the archive's rule too); a later copy of the same
        # outcome brings its code and text.
        rank_new, rank_old = progress(r["outcome"]), progress(old["outcome"])
        tie = rank_new == rank_old and (r == old or r["outcome"] != old["outcome"])
        if rank_new < rank_old or tie:
            filled = {k: v for k, v in r.items() if v is not None and old.get(k) is None}
            if filled:
                recipients[i] = {**old, **filled}
            return bool(filled)
        # Further along: its outcome, code and text replace the old ones; names stay known.
        recipients[i] = {**r, "name": r.get("name") or old.get("name")}
        recipients[i]["host"] = r.get("host") or old.get("host")
        return recipients[i] != old
    recipients.append(r)
    return True
