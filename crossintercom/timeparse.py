"""Ages and times as people type them (``30m``, ``12h``, ``7d``, ISO dates) and as messages
carry them (``sent_at``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final

_SINCE_RE = re.compile(r"^(\d+)\s*([smhdw])$")
_SINCE_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(value: str) -> int:
    """An age such as ``30m``, ``12h``, ``7d`` or ``2w``, in seconds (``ValueError`` if not)."""
    found = _SINCE_RE.match(value.strip())
    if not found:
        raise ValueError(f"{value!r} is not an age such as 30m, 12h, 7d or 2w")
    return int(found.group(1)) * _SINCE_UNITS[found.group(2)]


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """``--since``: an age (``30m``, ``12h``, ``7d``, ``2w``) or an ISO date or date-time (UTC
    unless it says otherwise). Raises ``ValueError`` with a readable message."""
    text = value.strip()
    if _SINCE_RE.match(text):
        try:
            return (now or datetime.now(UTC)) - timedelta(seconds=parse_age(text))
        except OverflowError:
            raise ValueError(f"--since {value!r} reaches back before the year 1") from None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--since {value!r} is neither an age (30m, 12h, 7d, 2w) nor an ISO date"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def parse_sent_at(value: str) -> datetime:
    """A message's ``sent_at`` as an aware datetime (now, for one that cannot be read)."""
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return datetime.now(UTC)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
