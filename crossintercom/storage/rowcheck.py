"""Rows as a writer of a SQLite file may have left them: SQLite keeps any value of any type in
any column, and its driver fails a whole read on one text that is not UTF-8. On SQLite the
delivery path, receipts and settings read such columns as bytes, checked here row by row, so
one bad value is refused or left out alone (docs/operations.md, "Trust model"). Roster rows,
which any host writes for itself, are checked here too (``session_info``)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, cast

import msgspec
from sqlalchemy import RowMapping

from crossintercom.models import (
    MAX_GROUPS,
    Cwd,
    Description,
    Name,
    Purpose,
    ReceiptOutcome,
    SessionInfo,
    WakePolicy,
)
from crossintercom.protocol.client_frames import SessionId
from crossintercom.storage import queries as q
from crossintercom.storage.interface import HostReport, InboundRow, ReceiptRow, StoreSettings
from crossintercom.storage.tables import (
    ERROR_CHARS,
    ERROR_CODE_CHARS,
    HOST_ID_CHARS,
    INTEGER_MAX,
    VERSION_CHARS,
)


def inbound_query(
    host_id: str,
    generation: int,
    limit: int,
    session_ids: Collection[str] | None,
    max_payload: int,
    arrays: bool,
    *,
    raw_payload: bool = False,
    skip_seqs: Collection[int] = (),
) -> tuple[Any, dict[str, Any]]:
    """``fetch_inbound``'s statement and parameters; ``raw_payload``: payloads read as bytes
    (SQLite, where a writer may store any bytes); ``skip_seqs``: rows the statement leaves
    out."""
    stmt = q.inbound(
        by_session=session_ids is not None,
        array=arrays,
        raw=raw_payload,
        skip=bool(skip_seqs),
    )
    params: dict[str, Any] = {
        "host_id": host_id,
        "generation": generation,
        "limit": limit,
        "max_payload": max_payload,
    }
    if session_ids is not None:
        params["session_ids"] = list(session_ids)
    if skip_seqs:
        params["skip_seqs"] = list(skip_seqs)
    return stmt, params


def inbound_row(
    seq: int,
    stored_id: str | bytes,
    stored_session: str | bytes,
    text: str | bytes | None,
    sender: str | bytes,
    length: int | None,
    stored_digest: str | bytes | None = None,
    *,
    max_payload: int,
) -> InboundRow:
    """One fetched row, its payload's text as stored: not decoded here (the relay decodes it
    into a message once, and hands the text itself over). Bytes (SQLite: every text column)
    are checked to be UTF-8 row by row, so a row that is not stands alone (refused by the
    relay's screening, and finished by its seq; docs/storage.md, "Delivery states")."""
    message_id, session = text_of(stored_id), text_of(stored_session)
    sender_host, digest = text_of(sender), text_of(stored_digest)

    def bad(problem: str) -> InboundRow:
        return InboundRow(
            seq,
            shown(stored_id),
            shown(stored_session),
            None,
            shown(sender_host or "?")[:HOST_ID_CHARS],
            problem,
            digest,
        )

    if message_id is None or session is None:
        return bad("message id or recipient session is not valid UTF-8")
    if sender_host is None or (stored_digest is not None and digest is None):
        return bad("sender host or digest is not valid UTF-8")
    if len(sender_host) > HOST_ID_CHARS:
        return bad(f"sender host is over {HOST_ID_CHARS} characters")
    if text is None:
        return bad(f"payload of {length} characters is over the {max_payload} that can be read")
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as exc:
            return bad(f"payload is not valid UTF-8 (byte {exc.start})")
    return InboundRow(seq, message_id, session, text, sender_host, None, digest)


def text_of(value: str | bytes | None) -> str | None:
    """A column read as its bytes (SQLite), as text; None when not UTF-8."""
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


def shown(value: str | bytes) -> str:
    """A stored value for a log line, whatever its bytes."""
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else value


def receipt_row(row: Sequence[Any]) -> ReceiptRow | None:
    """A ``SQLITE_LIST_RECEIPTS`` row as a receipt; None when one of its texts is not UTF-8 (a
    writer of the file stored it: no relay does)."""
    texts = [text_of(v) for v in row[1:]]
    if any(t is None and v is not None for t, v in zip(texts, row[1:], strict=True)):
        return None
    mid, session, host, outcome = (t or "" for t in texts[:4])
    return ReceiptRow(row[0], mid, session, host, cast(ReceiptOutcome, outcome), *texts[4:])


def settings_of(row: Sequence[Any] | None) -> tuple[StoreSettings, list[str]]:
    """The settings from a settings row (none: the defaults), and the names of the values that
    are not whole numbers from 0 to the column's 2**31 - 1 (SQLite keeps any value a writer
    stored: read as bytes there; a retention past the year 9999 failed every enqueue), which
    are left at their defaults."""
    if row is None:
        return StoreSettings(), []
    default, values, bad = StoreSettings(), {}, []
    for name, stored in zip(("max_message_bytes", "retention_s"), row, strict=True):
        value = _whole(stored.decode(errors="replace")) if isinstance(stored, bytes) else stored
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INTEGER_MAX:
            values[name] = value
        else:
            values[name] = getattr(default, name)
            bad.append(name)
    return StoreSettings(**values), bad


# A whole number as SQLite stores one: a 64-bit integer, in at most 19 ASCII digits.
_WHOLE = re.compile(r"-?[0-9]{1,19}")


def _whole(text: str) -> int | None:
    """``text`` as a whole number in ASCII digits; None when it is not one ("--5", or more
    digits than ``int`` converts, failed every read of the settings)."""
    return int(text) if _WHOLE.fullmatch(text) else None


def log_left_out(
    logger: logging.Logger,
    kind: str,
    why: str,
    bad: Sequence[str],
    key: str,
    over: Collection[str] = (),
    per_host: int = 0,
    setting: str = "",
) -> None:
    """Say, once per read, which rows a reader left out: ``bad`` (named, never quoted whole:
    a writer's value may be megabytes long) for ``why``, and the hosts ``over`` their bound."""
    if bad:
        # A writer of the store (or a bug) put values no relay writes: left out, alone.
        logger.warning(
            f'{kind} rows left out: {why} (docs/operations.md, "Trust model")',
            extra={key: list(bad[:20])},
        )
    if over:
        logger.warning(
            f"{kind} rows left out: hosts with more than %d (the per-host bound, {setting})",
            per_host,
            extra={"hosts": sorted(over)[:20]},
        )


# What a host may write of itself, by form: a version as PEP 440 spells one ("unknown" too), a
# code as codes.py spells them, an error as one line of text.
_VERSION = re.compile(rf"[0-9A-Za-z.+!_-]{{1,{VERSION_CHARS}}}")
_CODE = re.compile(rf"[a-z][a-z0-9_]{{0,{ERROR_CODE_CHARS - 1}}}")


def host_report(
    version: str | bytes | None,
    code: str | bytes | None,
    error: str | bytes | None,
    error_at: Any,
    *,
    age: Callable[[Any], float | None],
) -> HostReport:
    """What a host wrote of itself (``queries.host_reports``: each text cut to one past its
    bound, bytes on SQLite), each value kept only if it is text of its form within its bound;
    ``age``: seconds since a stored time, by the database's clock."""
    unreadable: list[str] = []

    def checked(name: str, value: str | bytes | None, ok: Callable[[str], bool]) -> str | None:
        if value is None:
            return None
        text = text_of(value)
        if text is None or not ok(text):
            unreadable.append(name)
            return None
        return text

    got_version = checked("version", version, lambda t: _VERSION.fullmatch(t) is not None)
    got_code = checked("error_code", code, lambda t: _CODE.fullmatch(t) is not None)
    got_error = checked("last_error", error, lambda t: len(t) <= ERROR_CHARS)
    error_age = age(text_of(error_at) if isinstance(error_at, bytes) else error_at)
    if error_at is not None and error_age is None:
        unreadable.append("error_at")
    return HostReport(got_version, got_code, got_error, error_age, tuple(unreadable))


class _Published(msgspec.Struct, frozen=True):
    """A roster row as a broker lets a session describe itself: names as registered, every
    field bounded (a host may publish anything in its own rows, and every `list` answer on
    every host carries them; docs/protocol.md)."""

    id: SessionId
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=HOST_ID_CHARS)]
    name: Name | None
    cwd: Cwd | None
    model: Description | None
    status: Description | None
    purpose: Purpose
    groups: Annotated[tuple[Name, ...], msgspec.Meta(max_length=MAX_GROUPS)]
    durable: bool
    online: bool
    wake: WakePolicy


def session_info(r: RowMapping) -> SessionInfo | None:
    """One roster row as a session, every value checked (SQLite keeps whatever a writer of the
    file stored, of any type); None for a row no relay would have written."""
    groups = r["groups"]
    try:
        if isinstance(groups, str | bytes):
            groups = msgspec.json.decode(groups)
        published = msgspec.convert(
            {
                "id": r["session_id"],
                "host": r["host_id"],
                "name": r["name"],
                "cwd": r["cwd"],
                "model": r["model"],
                "status": r["status"],
                "purpose": r["purpose"],
                "groups": groups,
                "durable": r["durable"],
                "online": r["online"],
                "wake": r["wake"] if r["wake"] in ("asks", "urgent", "never") else "every",
            },
            _Published,
        )
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return SessionInfo(**msgspec.structs.asdict(published))


def age(then: datetime | str | None, now: datetime | None) -> float | None:
    """Seconds from ``then`` to ``now``, both the database's (SQLite's come without a zone:
    UTC, as CURRENT_TIMESTAMP writes them, and as text: None when a writer stored another)."""
    if isinstance(then, str):
        try:
            then = datetime.fromisoformat(then)
        except ValueError:
            return None
    if not isinstance(then, datetime) or now is None:
        return None
    then, now = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (then, now))
    return max(0.0, (now - then).total_seconds())
