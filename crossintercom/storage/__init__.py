"""The shared mailbox store: one interface, a PostgreSQL and a SQLite backend.

``open_store(url)`` picks the backend from the URL scheme alone and refuses to run against a
store whose schema is missing or from another version.
"""

from __future__ import annotations

from crossintercom.storage.base import (
    Ack,
    EnqueueResult,
    HostRow,
    InboundRow,
    MailboxStore,
    MessageRow,
    OutboundItem,
    ReceiptRow,
    StoreSettings,
    Waiter,
)
from crossintercom.storage.liveness import LeaseTracker
from crossintercom.storage.urls import mask_url, parse_store_url


def open_store(url: str, *, polling_observer: bool = False) -> MailboxStore:
    """Open the store at ``url`` and check its schema; raises a ``StoreError`` with a clear
    one-line message (password masked) when it cannot be used."""
    parsed = parse_store_url(url)
    store: MailboxStore
    if parsed.kind == "postgres":
        from crossintercom.storage.postgres import PostgresStore

        store = PostgresStore(parsed)
    else:
        from crossintercom.storage.sqlite import SqliteStore

        store = SqliteStore(parsed, polling_observer=polling_observer)
    try:
        store.check_schema()
    except BaseException:
        store.close()
        raise
    return store


__all__ = [
    "Ack",
    "EnqueueResult",
    "HostRow",
    "InboundRow",
    "LeaseTracker",
    "MailboxStore",
    "MessageRow",
    "OutboundItem",
    "ReceiptRow",
    "StoreSettings",
    "Waiter",
    "mask_url",
    "open_store",
    "parse_store_url",
]
