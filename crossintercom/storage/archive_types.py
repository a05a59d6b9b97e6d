"""The archive's interface (docs/archive.md): what a relay copies and what ``search`` and the
overseer page read back. Never part of a delivery; apart from ``interface`` (the mailbox's)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from crossintercom.models import Message
from crossintercom.search_model import SearchHit, SearchQuery

# --- the archive (docs/archive.md) ----------------------------------------------------------------

DEFAULT_ARCHIVE_RETENTION_S = 30 * 86400


@dataclass(frozen=True, slots=True)
class ArchiveSettings:
    """Off unless an operator turned it on for the whole store."""

    enabled: bool = False
    retention_s: int = DEFAULT_ARCHIVE_RETENTION_S


@dataclass(frozen=True, slots=True)
class ArchiveRecipient:
    session_id: str
    host_id: str
    outcome: str
    name: str | None = None
    code: str | None = None


@dataclass(frozen=True, slots=True)
class ArchiveEntry:
    """What a relay copies: a message its host saw and what it knows of its recipients;
    ``wait_s``: an ask's wait, known to the sender's host only."""

    message: Message
    recipients: tuple[ArchiveRecipient, ...] = ()
    wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class ReceiptUpdate:
    """A later outcome (``shown``, ``acknowledged``, ``expired``) of a message already archived
    for a recipient on ``host_id``, the writing relay's own host: it moves only that host's
    recipients' rows, and only further along (``further``)."""

    message_id: str
    session_id: str
    host_id: str
    outcome: str
    code: str | None = None


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    seq: int
    message: Message
    recipients: tuple[ArchiveRecipient, ...] = ()
    wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class ThreadSummary:
    thread_id: str
    subject: str | None
    messages: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class FlowEdge:
    """Messages from one host to another (the same host for local ones) in the archive."""

    sender_host: str
    recipient_host: str
    messages: int


class ArchiveStore(Protocol):
    """The shared archive: written by relays off the delivery path (batched, bounded in time),
    read by ``search`` and the overseer page; a store's ``archive``, on the store's own
    driver and connection. Never part of a delivery."""

    url_masked: str

    async def archive_settings(self) -> ArchiveSettings: ...

    async def set_archive(
        self, *, enabled: bool, retention_s: int | None = None
    ) -> ArchiveSettings: ...

    async def archive(self, entries: Sequence[ArchiveEntry | ReceiptUpdate]) -> int: ...

    async def receipts_of(
        self, message_ids: Sequence[str]
    ) -> dict[str, tuple[ArchiveRecipient, ...]]:
        """The recipients of these messages as the archive has them now."""
        ...

    async def search(self, query: SearchQuery) -> list[SearchHit]: ...

    async def feed(self, after_seq: int, *, limit: int = 200) -> list[ArchivedMessage]: ...

    async def thread(self, thread_id: str, *, limit: int = 500) -> list[ArchivedMessage]: ...

    async def threads(self, *, limit: int = 50) -> list[ThreadSummary]: ...

    async def flow(self) -> list[FlowEdge]: ...

    async def purge_archive(self, *, batch: int = 1000) -> int: ...
