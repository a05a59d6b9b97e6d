"""A store's archive for a test's blocking code: each call runs the store's coroutine on
``storage.blocking``'s loop, where the store was opened (one store, one connection)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from crossintercom.storage.blocking import BlockingStore, open_blocking_store


class SyncArchive:
    """``SyncArchive(url).feed(0)`` for ``await store.archive.feed(0)``."""

    def __init__(self, url: str, *, host_id: str | None = None) -> None:
        self.blocking: BlockingStore = open_blocking_store(url, host_id=host_id)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.blocking.store.archive, name)
        return lambda *args, **kwargs: self.blocking.run(method(*args, **kwargs))

    def close(self) -> None:
        self.blocking.close()
