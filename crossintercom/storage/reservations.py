"""Path reservations in the shared store (docs/agents.md#path-reservations): the store is the
authority. A reserve is one transaction that serialises on its project (an advisory lock on
PostgreSQL; SQLite's writers are serial), reads the project's live reservations, decides in
Python (``crossintercom.reservations``, in a thread, over the rows not compared before the
transaction) and inserts fenced by the host's generation. Every read is bounded and checks
each row another host wrote (``read_live``). The operations are the store's
(``sqlstore.SqlStore.reserve`` and beside it); this module reads, checks and counts the rows.

Whether a holder's host is alive is the reader's judgement on its own clock (``lapsed``, from
the relay's lease tracker): the store has no clock all hosts share.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

import msgspec
from sqlalchemy import Connection

from crossintercom.errors import QuotaExceeded
from crossintercom.models import Name
from crossintercom.protocol.client_frames import SessionId
from crossintercom.reservations import (
    MAX_GLOB,
    MAX_REASON,
    PER_HOST,
    READ_LIMIT,
    Held,
    Mode,
    Quotas,
)
from crossintercom.storage import queries as q
from crossintercom.storage.rowcheck import log_left_out
from crossintercom.storage.tables import HOST_ID_CHARS

log = logging.getLogger(__name__)

# The longest TTL a relay gives (the wire's bound, protocol.Reserve): a row lapsing later was
# not written by a relay, and is not read (queries.live_reservations).
MAX_TTL_S = 30 * 86400


class _Stored(msgspec.Struct, frozen=True):
    """A reservation row's texts as a relay writes them (``reservations.normalise``, the wire's
    bounds); any other value was written by another writer of the store."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    project: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    glob: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_GLOB)]
    mode: Mode
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=HOST_ID_CHARS)]
    session: SessionId
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] | None
    name: Name | None


def _text(value: object) -> object:
    # SQLite's columns come as bytes (queries.live_reservations): text only if UTF-8.
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value
    return value


def _when(value: object) -> float | None:
    """Unix seconds from a stored time: a number (PostgreSQL's epoch) or SQLite's text; None
    for anything else, or a time no reader can hold."""
    value = _text(value)
    if isinstance(value, str):
        try:
            at = datetime.fromisoformat(value)
        except ValueError:
            return None
        seconds = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
    elif isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        seconds = float(value)
    else:
        return None
    return seconds if math.isfinite(seconds) else None


def held_row(row: Sequence[Any]) -> Held | None:
    """One row of ``queries.live_reservations`` as a reservation; None for a row no relay
    would have written (a value of the wrong type, size or encoding, a time that is none)."""
    rid, project, glob, mode, host, session, expires, created, reason, name = row[:10]
    expires_at, made = _when(expires), _when(created)
    if expires_at is None or made is None:
        return None
    try:
        h = msgspec.convert(
            {
                "id": _text(rid),
                "project": _text(project),
                "glob": _text(glob),
                "mode": _text(mode),
                "host": _text(host),
                "session": _text(session),
                "reason": _text(reason),
                "name": _text(name),
            },
            _Stored,
        )
    except msgspec.ValidationError:
        return None
    return Held(
        h.id, h.project, h.glob, h.mode, h.host, h.session, expires_at, made, h.reason, h.name
    )


def read_live(
    conn: Connection,
    dialect: str,
    project: str | None,
    *,
    lapsed: Collection[str] = (),
    per_host: int = PER_HOST,
    limit: int = READ_LIMIT,
) -> tuple[list[Held], bool]:
    """The live reservations of ``project`` (None: every project's), oldest first, those of
    hosts in ``lapsed`` left out; and whether there were more than ``limit``. Bounded whatever
    the store holds: rows no relay would have written are left out and logged, alone, and so
    are a host's rows past ``per_host``."""
    now = datetime.now(UTC)
    params: dict[str, Any] = {
        "now": now,
        "latest": now + timedelta(seconds=MAX_TTL_S + 86400),
        "per_host": per_host,
        "limit": limit + 1,
    }
    if project is not None:
        params["project"] = project
    out, bad, over = [], [], set()
    for row in conn.execute(q.live_reservations(dialect, project is not None), params):
        h = held_row(row)
        if int(row[10]) > per_host:
            over.add(_shown(row[4]))
        if h is None:
            bad.append(f"{_shown(row[0])} of {_shown(row[4])}")
        elif h.host not in lapsed:
            out.append(h)
    log_left_out(
        log,
        "reservation",
        "values of the wrong type, size or encoding, or a time that is none",
        bad,
        "rows",
        over,
        per_host,
        "reservation_max_per_host",
    )
    return out[:limit], len(out) > limit


def _shown(value: object) -> str:
    return repr(_text(value))[:80]


def check_quotas(
    conn: Connection, quotas: Quotas, globs: Sequence[str], reason: str | None, base: dict[str, Any]
) -> None:
    """``QuotaExceeded`` when ``globs`` would take the session or its host past its quota
    (the rows the reserve renews not counted twice)."""
    adding = len(globs)
    chars = sum(len(g) + len(reason or "") for g in globs)
    params = {**base, "renewer": base["session_id"], "globs": list(globs)}
    for whose, session, most, most_chars in (
        ("session", base["session_id"], quotas.per_session, quotas.per_session_chars),
        ("host", None, quotas.per_host, quotas.per_host_chars),
    ):
        count, used = conn.execute(q.RESERVATION_USAGE, {**params, "session_id": session}).one()
        if int(count) + adding > most or int(used) + chars > most_chars:
            raise QuotaExceeded(
                f"not reserved: this {whose} would hold {int(count) + adding} reservations "
                f"({int(used) + chars} characters of globs and reasons); its quota is {most} "
                f"({most_chars} characters). Release some (`crossintercom unreserve`) or "
                "reserve a wider glob"
            )
