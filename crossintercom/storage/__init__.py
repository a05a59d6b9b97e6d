"""The shared mailbox store: one interface, a PostgreSQL and a SQLite backend.

``await open_store(url)`` picks the backend from the URL scheme alone and refuses to run
against a store whose schema is missing or from another version. Every operation is a
coroutine on the loop that opened the store; blocking callers (the CLI, tools, tests) open it
with ``blocking.open_blocking_store`` and run the same operations on a loop of its own.

Inside the package, imports run one way (no cycle): ``interface`` (the protocol and its
rows), ``archive_types`` (the archive's) and ``urls`` at the bottom; ``tables``, then
``queries``; ``engine`` (engines and error translation); over it ``migrate`` (Alembic),
``driver`` (one operation, one transaction: retries, in-doubt commits, errors; SQLite's
worker thread), ``pgdriver`` (PostgreSQL's on the event loop: deadlines, dead connections,
plans, row security) and ``wakeup``; ``batches`` (batch writes over one connection) and
``reservations`` (path reservations' rows), under ``sqlstore`` (``SqlStore``, the one store,
over a driver and a dialect), under the dialects ``postgres`` and ``sqlite`` (each one's
alternatives, and its store's factory); ``blocking`` (the loop of blocking callers) on top;
``liveness`` apart, over ``interface``.
"""

from __future__ import annotations

from crossintercom.models import AckOutcome, DeliveryState, ReceiptOutcome
from crossintercom.storage.archive_types import (
    ArchivedMessage,
    ArchiveEntry,
    ArchiveRecipient,
    ArchiveSettings,
    ArchiveStore,
    FlowEdge,
    ReceiptUpdate,
    ThreadSummary,
)
from crossintercom.storage.interface import (
    Ack,
    Beat,
    EnqueueResult,
    HostReport,
    HostRow,
    InboundRow,
    InDoubtEnqueue,
    InDoubtResolution,
    LateReceipt,
    MailboxStore,
    MessageRow,
    OutboundItem,
    QueuedMail,
    ReceiptRow,
    Reserved,
    StoreSettings,
    StuckTransaction,
    Waiter,
    Wake,
)
from crossintercom.storage.liveness import LeaseTracker
from crossintercom.storage.urls import mask_url, parse_store_url


async def open_store(
    url: str, *, polling_observer: bool | None = None, host_id: str | None = None
) -> MailboxStore:
    """Open the store at ``url`` on the running loop and check its schema; raises a
    ``StoreError`` with a clear one-line message (password masked) when it cannot be used.
    ``host_id``: the relay's host, named in its PostgreSQL connections' ``application_name``."""
    # The backends are imported here, not with the package: every CLI command imports
    # storage.urls (to mask a URL), and the backends pull in alembic, psycopg and watchdog,
    # which doubled the package's import time. No cycle is involved (see the docstring).
    parsed = parse_store_url(url)
    store: MailboxStore
    if parsed.kind == "postgres":
        from crossintercom.storage.postgres import postgres_store

        store = postgres_store(parsed, host_id=host_id)
    else:
        from crossintercom.storage.sqlite import sqlite_store

        store = sqlite_store(parsed, polling_observer=polling_observer)
    try:
        await store.check_schema()
    except BaseException:
        await store.aclose()
        raise
    return store


__all__ = [
    "Ack",
    "AckOutcome",
    "ArchiveEntry",
    "ArchiveRecipient",
    "ArchiveSettings",
    "ArchiveStore",
    "ArchivedMessage",
    "Beat",
    "DeliveryState",
    "EnqueueResult",
    "FlowEdge",
    "HostReport",
    "HostRow",
    "InDoubtEnqueue",
    "InDoubtResolution",
    "InboundRow",
    "LateReceipt",
    "LeaseTracker",
    "MailboxStore",
    "MessageRow",
    "OutboundItem",
    "QueuedMail",
    "ReceiptOutcome",
    "ReceiptRow",
    "ReceiptUpdate",
    "Reserved",
    "StoreSettings",
    "StuckTransaction",
    "ThreadSummary",
    "Waiter",
    "Wake",
    "mask_url",
    "open_store",
    "parse_store_url",
]
