"""The store for blocking callers: the CLI's commands, the overseer page's read-only view,
tools and tests run exactly the store's own coroutines, on one event loop in a daemon thread.

Async engines' pooled connections belong to the loop that made them, so every store opened
here lives on that one loop, for the life of the process, and ``run`` hands each operation
to it: ``run(store.roster())`` from any thread but the loop's own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from crossintercom.storage import open_store
from crossintercom.storage.driver import call_on
from crossintercom.storage.interface import MailboxStore

T = TypeVar("T")
_lock = threading.Lock()
_loops: list[asyncio.AbstractEventLoop] = []  # the one loop, once started


def _the_loop() -> asyncio.AbstractEventLoop:
    with _lock:
        if not _loops:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="store-loop", daemon=True).start()
            _loops.append(loop)
        return _loops[0]


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` (a store operation) on the blocking callers' loop and wait for it."""
    return call_on(_the_loop(), coro)


@dataclass
class BlockingStore:
    """A store opened on the blocking callers' loop: ``bs.run(bs.store.hosts())``."""

    store: MailboxStore

    @staticmethod
    def run(coro: Coroutine[Any, Any, T]) -> T:
        return run(coro)

    def close(self) -> None:
        run(self.store.aclose())

    def __enter__(self) -> BlockingStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_blocking_store(
    url: str, *, polling_observer: bool | None = None, host_id: str | None = None
) -> BlockingStore:
    """``open_store`` for blocking callers (its errors as its own)."""
    return BlockingStore(run(open_store(url, polling_observer=polling_observer, host_id=host_id)))
