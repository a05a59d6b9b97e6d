"""The shared mailbox store: one interface, a PostgreSQL and a SQLite backend.

``open_store(url)`` picks the backend from the URL scheme alone and refuses to run against a
store whose schema is missing or from another version.

Inside the package, imports run one way (no cycle): ``interface`` (the protocol and its rows)
and ``urls`` at the bottom; ``tables``, then ``queries``; ``engine`` (engines and error
translation); over it ``migrate`` (Alembic), ``transaction`` (one operation, one transaction)
and ``wakeup``; ``batches`` (batch writes over one connection); ``sqlstore`` (the logic both
backends share); the backends ``postgres`` and ``sqlite`` on top; ``liveness`` apart, over
``interface``.
"""

from __future__ import annotations

from crossintercom.storage.interface import (
    Ack,
    AckOutcome,
    DeliveryState,
    EnqueueResult,
    HostRow,
    InboundRow,
    InDoubtEnqueue,
    InDoubtResolution,
    LateReceipt,
    MailboxStore,
    MessageRow,
    OutboundItem,
    ReceiptOutcome,
    ReceiptRow,
    StoreSettings,
    Waiter,
)
from crossintercom.storage.liveness import LeaseTracker
from crossintercom.storage.urls import mask_url, parse_store_url


def open_store(url: str, *, polling_observer: bool = False) -> MailboxStore:
    """Open the store at ``url`` and check its schema; raises a ``StoreError`` with a clear
    one-line message (password masked) when it cannot be used."""
    # The backends are imported here, not with the package: every CLI command imports
    # storage.urls (to mask a URL), and the backends pull in alembic, psycopg and watchdog,
    # which doubled the package's import time. No cycle is involved (see the docstring).
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
    "AckOutcome",
    "DeliveryState",
    "EnqueueResult",
    "HostRow",
    "InDoubtEnqueue",
    "InDoubtResolution",
    "InboundRow",
    "LateReceipt",
    "LeaseTracker",
    "MailboxStore",
    "MessageRow",
    "OutboundItem",
    "ReceiptOutcome",
    "ReceiptRow",
    "StoreSettings",
    "Waiter",
    "mask_url",
    "open_store",
    "parse_store_url",
]
