"""What the tools share besides the harness: a scratch directory and the store they run against."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from crossintercom.storage import migrate, parse_store_url
from crossintercom.storage.urls import StoreURL


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary directory for a run's runtime dirs and files, removed with all it holds."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Store:
    url: str
    parsed: StoreURL
    label: str  # what a report shows: the URL without its password, or "temporary SQLite file"

    @property
    def kind(self) -> str:
        return self.parsed.kind


def prepare_store(store_url: str | None, root: Path) -> Store:
    """The store to run against, its schema created or upgraded; default: a new SQLite file in
    ``root``."""
    url = store_url or f"sqlite:///{root / 'mailbox.sqlite'}"
    parsed = parse_store_url(url)
    migrate.upgrade(url)
    return Store(url, parsed, parsed.masked if store_url else "temporary SQLite file")


def utc_now() -> str:
    """The run's date as reports print it."""
    return datetime.now(UTC).isoformat(timespec="seconds")
