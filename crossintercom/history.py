"""What this host can read of past messages: the shared archive when the store has it on,
otherwise this host's inboxes (docs/archive.md). Used by ``crossintercom search`` and the
overseer page; read-only, and never on a delivery's path.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from crossintercom.config import Settings
from crossintercom.inbox_search import search_inboxes
from crossintercom.search_model import SearchHit, SearchQuery
from crossintercom.storage import ArchiveStore, MailboxStore

Source = Literal["archive", "inbox"]


@dataclass(frozen=True, slots=True)
class SearchResult:
    source: Source
    hits: list[SearchHit]


async def history_archive(store: MailboxStore | None) -> ArchiveStore | None:
    """The store's archive when there is a store (its schema checked when it was opened) and
    the archive is on."""
    if store is None or not (await store.archive.archive_settings()).enabled:
        return None
    return store.archive


async def search(
    settings: Settings, query: SearchQuery, archive: ArchiveStore | None
) -> SearchResult:
    if archive is not None:
        return SearchResult("archive", await archive.search(query))
    # The inboxes are files of this host: read off the loop.
    hits = await asyncio.to_thread(search_inboxes, settings.inbox_dir, settings.host_id, query)
    return SearchResult("inbox", hits)
