"""What this host can read of past messages: the shared archive when the store has it on,
otherwise this host's inboxes (docs/archive.md). Used by ``crossintercom search`` and the
overseer page; read-only, and never on a delivery's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from crossintercom.config import Settings
from crossintercom.inbox_search import search_inboxes
from crossintercom.search_model import SearchHit, SearchQuery
from crossintercom.storage import ArchiveStore, open_archive
from crossintercom.storage.connection import connection_url

Source = Literal["archive", "inbox"]


@dataclass(frozen=True, slots=True)
class SearchResult:
    source: Source
    hits: list[SearchHit]


def open_history(settings: Settings) -> ArchiveStore | None:
    """The archive when this host has a store (schema checked) and the archive is on."""
    url = connection_url(settings)
    if url is None:
        return None
    archive = open_archive(url)
    try:
        archive.check_schema()
        if archive.archive_settings().enabled:
            return archive
    except BaseException:
        archive.close()
        raise
    archive.close()
    return None


def search(settings: Settings, query: SearchQuery, archive: ArchiveStore | None) -> SearchResult:
    if archive is not None:
        return SearchResult("archive", archive.search(query))
    return SearchResult("inbox", search_inboxes(settings.inbox_dir, settings.host_id, query))
