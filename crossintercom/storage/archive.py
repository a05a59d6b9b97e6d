"""The shared archive (``ArchiveStore``) over either backend (docs/archive.md).

It runs on the store's own driver (``store.archive``): the same connection, the same retry,
deadline and error translation, no connection of its own (docs/storage.md, "Connections").
A write is bounded on PostgreSQL by its statement and lock timeouts (``queries``), so a slow
or locked archive holds the relay's connection no longer than that, and a failing one fails
its batch alone: the relay's archiver drops the copies and the deliveries go on.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

# The archive keeps the furthest outcome any host reported, so a copy that arrives late never
# takes a receipt back (docs/archive.md): the one order of models.PROGRESS, which the store's
# upsert applies too.
from crossintercom.models import Message, further
from crossintercom.search_model import SearchHit, SearchQuery, search_terms
from crossintercom.storage import queries as q
from crossintercom.storage.archive_types import (
    ArchivedMessage,
    ArchiveEntry,
    ArchiveRecipient,
    ArchiveSettings,
    FlowEdge,
    ReceiptUpdate,
    ThreadSummary,
)
from crossintercom.storage.driver import Driver
from crossintercom.timeparse import parse_sent_at

MAX_SEARCH_RESULTS = 200
RECEIPTS_CHUNK = 500


class SqlArchive:
    """The archive half of a store: its operations on the store's driver."""

    def __init__(self, driver: Driver, dialect: str) -> None:
        self.url_masked = driver.parsed.masked
        self.dialect = dialect
        self._run = driver.run

    # -- settings -------------------------------------------------------------------------

    async def archive_settings(self) -> ArchiveSettings:
        def read(conn: Connection) -> ArchiveSettings:
            row = conn.execute(q.READ_ARCHIVE_SETTINGS).one_or_none()
            return ArchiveSettings() if row is None else ArchiveSettings(bool(row[0]), int(row[1]))

        return await self._run(read, single_statement=True)

    async def set_archive(
        self, *, enabled: bool, retention_s: int | None = None
    ) -> ArchiveSettings:
        """Turn the store-wide archive on or off (an operator action); retention kept unless
        given."""
        current = await self.archive_settings()
        wanted = ArchiveSettings(
            enabled, current.retention_s if retention_s is None else retention_s
        )
        params = {"enabled": wanted.enabled, "retention_s": wanted.retention_s}
        await self._run(lambda c: c.execute(q.upsert_archive_settings(self.dialect), params))
        return wanted

    # -- writing --------------------------------------------------------------------------

    async def archive(self, entries: Sequence[ArchiveEntry | ReceiptUpdate]) -> int:
        """Copy a batch in one transaction; returns how many messages it held."""
        if not entries:
            return 0
        now = datetime.now(UTC)
        rows: dict[str, dict[str, Any]] = {}
        recipients: dict[tuple[str, str], dict[str, Any]] = {}
        updates: dict[tuple[str, str], dict[str, Any]] = {}
        for entry in entries:
            if isinstance(entry, ReceiptUpdate):
                key = (entry.message_id, entry.session_id)
                if key not in updates or further(entry.outcome, updates[key]["new_outcome"]):
                    updates[key] = _update_row(entry)
                continue
            row = _message_row(entry.message, now, entry.wait_s)
            if entry.wait_s is not None or entry.message.id not in rows:
                rows[entry.message.id] = row
            for r in entry.recipients:
                key = (entry.message.id, r.session_id)
                # Within one batch, too, the furthest outcome wins.
                if key in recipients and not further(r.outcome, recipients[key]["outcome"]):
                    continue
                recipients[key] = {
                    "message_id": entry.message.id,
                    "session_id": r.session_id,
                    "host_id": r.host_id,
                    "name": r.name,
                    "outcome": r.outcome,
                    "code": r.code,
                }
        plain = [r for r in rows.values() if "wait_s" not in r["payload"]]
        waits = [r for r in rows.values() if "wait_s" in r["payload"]]

        def write(conn: Connection) -> None:
            if self.dialect == "postgresql":
                conn.execute(q.PG_ARCHIVE_STATEMENT_TIMEOUT)
            if plain:
                conn.execute(q.archive_messages_if_absent(self.dialect), plain)
            if waits:
                conn.execute(q.archive_messages_with_wait(self.dialect), waits)
            if recipients:
                conn.execute(q.archive_recipients_upsert(self.dialect), list(recipients.values()))
            if updates:
                conn.execute(q.ARCHIVE_RECEIPT_UPDATE, list(updates.values()))

        await self._run(write)
        return len(rows)

    async def purge_archive(self, *, batch: int = 1000) -> int:
        """Delete what is older than the retention, in bounded transactions."""
        keep = (await self.archive_settings()).retention_s
        total = 0
        while True:
            try:
                cutoff = datetime.now(UTC) - timedelta(seconds=keep)
            except OverflowError:  # kept since before the year 1: nothing is old enough
                return total
            params = {"cutoff": cutoff, "limit": batch}

            def one_batch(conn: Connection, params: dict[str, Any] = params) -> int:
                ids = list(conn.execute(q.ARCHIVE_EXPIRED_IDS, params).scalars())
                if ids:
                    conn.execute(q.ARCHIVE_DELETE_RECIPIENTS, {"message_ids": ids})
                    conn.execute(q.ARCHIVE_DELETE_MESSAGES, {"message_ids": ids})
                return len(ids)

            done = await self._run(one_batch)
            total += done
            if done < batch:
                return total

    # -- reading --------------------------------------------------------------------------

    async def search(self, query: SearchQuery) -> list[SearchHit]:
        if not search_terms(query.text):
            return []
        limited = query if query.limit <= MAX_SEARCH_RESULTS else _capped(query)
        stmt, params = q.archive_search(self.dialect, limited)

        def read(conn: Connection) -> list[SearchHit]:
            return [
                SearchHit(Message.from_dict(payload), float(score), str(snippet or ""))
                for _seq, payload, score, snippet in conn.execute(stmt, params)
            ]

        return await self._run(read, single_statement=True)

    async def feed(self, after_seq: int, *, limit: int = 200) -> list[ArchivedMessage]:
        return await self._archived(q.ARCHIVE_FEED, {"after": after_seq, "limit": limit})

    async def thread(self, thread_id: str, *, limit: int = 500) -> list[ArchivedMessage]:
        return await self._archived(q.ARCHIVE_THREAD, {"thread_id": thread_id, "limit": limit})

    async def threads(self, *, limit: int = 50) -> list[ThreadSummary]:
        def read(conn: Connection) -> list[ThreadSummary]:
            return [
                ThreadSummary(t, s, int(n), int(last))
                for t, s, n, last in conn.execute(q.ARCHIVE_THREADS, {"limit": limit})
            ]

        return await self._run(read, single_statement=True)

    async def flow(self) -> list[FlowEdge]:
        def read(conn: Connection) -> list[FlowEdge]:
            return [FlowEdge(s, r, int(n)) for s, r, n in conn.execute(q.ARCHIVE_FLOW)]

        return await self._run(read, single_statement=True)

    async def receipts_of(
        self, message_ids: Sequence[str]
    ) -> dict[str, tuple[ArchiveRecipient, ...]]:
        ids = list(message_ids)

        def read(conn: Connection) -> dict[str, tuple[ArchiveRecipient, ...]]:
            out: dict[str, tuple[ArchiveRecipient, ...]] = {}
            for i in range(0, len(ids), RECEIPTS_CHUNK):  # bounded lists of bound values
                out.update(_recipients(conn, ids[i : i + RECEIPTS_CHUNK]))
            return out

        return await self._run(read) if ids else {}

    async def _archived(self, stmt: Any, params: dict[str, Any]) -> list[ArchivedMessage]:
        def read(conn: Connection) -> list[ArchivedMessage]:
            rows = conn.execute(stmt, params).all()
            ids = [Message.from_dict(payload).id for _seq, payload in rows]
            by_id = _recipients(conn, ids) if ids else {}
            out = []
            for seq, payload in rows:
                msg = Message.from_dict(payload)
                wait = payload.get("wait_s") if isinstance(payload, dict) else None
                out.append(
                    ArchivedMessage(
                        int(seq),
                        msg,
                        by_id.get(msg.id, ()),
                        float(wait) if isinstance(wait, int | float) else None,
                    )
                )
            return out

        return await self._run(read)


def _recipients(conn: Connection, ids: list[str]) -> dict[str, tuple[ArchiveRecipient, ...]]:
    by_id: dict[str, list[ArchiveRecipient]] = {}
    for mid, sid, host, outcome, name, code in conn.execute(
        q.ARCHIVE_RECIPIENTS_OF, {"message_ids": ids}
    ):
        by_id.setdefault(mid, []).append(ArchiveRecipient(sid, host, outcome, name, code))
    return {mid: tuple(rs) for mid, rs in by_id.items()}


def _capped(query: SearchQuery) -> SearchQuery:
    import msgspec

    return msgspec.structs.replace(query, limit=MAX_SEARCH_RESULTS)


def _update_row(u: ReceiptUpdate) -> dict[str, Any]:
    return {
        "mid": u.message_id,
        "sid": u.session_id,
        "host": u.host_id,
        "new_outcome": u.outcome,
        "new_code": u.code,
    }


def _message_row(msg: Message, now: datetime, wait_s: float | None = None) -> dict[str, Any]:
    payload = msg.to_dict()
    if wait_s is not None:
        # Beside the message's own fields (Message.from_dict leaves it out): docs/archive.md.
        payload["wait_s"] = wait_s
    return {
        "message_id": msg.id,
        "thread_id": msg.thread,
        "subject": msg.subject,
        "sender_id": msg.sender.id,
        "sender_name": msg.sender.name,
        "sender_host": msg.sender.host,
        "target": msg.to,
        "body": msg.text,
        "reply_to": msg.reply_to,
        "expects_reply": msg.expects_reply,
        "sent_at": parse_sent_at(msg.sent_at),
        "archived_at": now,
        "payload": payload,
    }
