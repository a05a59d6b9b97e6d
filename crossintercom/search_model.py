"""What a search asks and finds, the same for the archive on either backend and for inboxes
(docs/archive.md)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final, Literal

from crossintercom.models import Message, _Value

# Snippet highlight marks, the same from every source (archive on either backend, inboxes);
# a page escapes the text first and only then turns the marks into highlighting.
MARK_START: Final = "\u00ab"
MARK_END: Final = "\u00bb"


def search_terms(text: str) -> list[str]:
    """The words a query looks for: letters and digits only, so no query syntax of either
    full-text engine (quotes, NEAR, ``*``, ``:``, ``-``) is ever passed through."""
    return re.findall(r"\w+", text.lower())


class SearchQuery(_Value, frozen=True, omit_defaults=True):
    text: str
    sender: str | None = None
    recipient: str | None = None
    host: str | None = None
    thread: str | None = None
    since: datetime | None = None
    limit: int = 20


class SearchHit(_Value, frozen=True):
    """One result: the message, a relevance score (higher is better) and a snippet of its text
    with the matched words between ``MARK_START`` and ``MARK_END``."""

    message: Message
    score: float
    snippet: str
    source: Literal["archive", "inbox"] = "archive"

    def to_json(self) -> dict[str, Any]:
        """The CLI's shape: the message object with ``score``, ``snippet`` and ``source``."""
        return {
            **self.message.to_dict(),
            "score": self.score,
            "snippet": self.snippet,
            "source": self.source,
        }
