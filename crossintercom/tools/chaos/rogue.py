"""Rows a rogue with database access writes straight into the shared store, for `crossintercom
chaos`: the receiving relay must refuse each once, with a reason, without blocking the rows
behind it. And, for its takeover fault, whether a frozen relay holds the store's locks."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError

from crossintercom.errors import Code
from crossintercom.models import Message, new_id
from crossintercom.storage import queries as q
from crossintercom.storage.engine import store_engine
from crossintercom.storage.urls import parse_store_url


def inject_rows(
    url: str,
    rows: list[tuple[str, Any]],
    *,
    sender_host: str,
    recipient_host: str,
    recipient_session: str,
) -> None:
    """(message id, payload) pairs, one message and one queued delivery each, in one
    transaction."""
    now = datetime.now(UTC)
    engine = store_engine(parse_store_url(url), pool_size=1)
    try:
        with engine.begin() as conn:
            for mid, payload in rows:
                conn.execute(
                    q.ROGUE_INSERT_MESSAGE,
                    {
                        "message_id": mid,
                        "sender_host": sender_host,
                        "digest": _digest(payload),
                        "payload": payload,
                        "size": 1,
                        "created": now,
                    },
                )
                conn.execute(
                    q.ROGUE_INSERT_DELIVERY,
                    {
                        "message_id": mid,
                        "recipient_host": recipient_host,
                        "recipient_session": recipient_session,
                        "state": "queued",
                        "expires_at": now + timedelta(days=1),
                    },
                )
    finally:
        engine.dispose()


def _digest(payload: Any) -> str:
    """The digest a relay would store with ``payload`` (a rogue can compute it too), so each
    row is refused for what is wrong with it; zeros for a payload that is no message."""
    try:
        return Message.from_dict(payload).digest()
    except ValueError:
        return "0" * 64


def delivery_reasons(url: str, ids: list[str]) -> dict[str, tuple[str, str | None]]:
    """message id -> (delivery state, reason) of the given rows."""
    if not ids:
        return {}
    engine = store_engine(parse_store_url(url), pool_size=1)
    try:
        with engine.connect() as conn:
            rows = conn.execute(q.DELIVERY_REASONS, {"message_ids": ids})
            return {mid: (str(state), reason) for mid, state, reason in rows}
    finally:
        engine.dispose()


def rogue_message(
    sender_id: str, sender_host: str, *, mid: str | None = None, **fields: Any
) -> dict[str, Any]:
    """A well-formed message payload (what a relay would write), fields overridable."""
    out: dict[str, Any] = {
        "type": "message",
        "id": mid or new_id(),
        "from": {"id": sender_id, "name": "rogue", "host": sender_host},
        "to": "worker",
        "message": "hello",
        "attachments": [],
        "reply_to": None,
        "expects_reply": False,
        "sent_at": "2026-01-01T00:00:00.000Z",
        "flags": [],
    }
    out.update(fields)
    return out


# What each kind of bad row is refused with.
HOSTILE_KINDS: dict[str, str] = {
    "string": Code.BAD_MESSAGE,
    "null": Code.BAD_MESSAGE,
    "array": Code.BAD_MESSAGE,
    "id_object": Code.BAD_MESSAGE,
    "text_number": Code.BAD_MESSAGE,
    "forged_host": Code.FORGED_SENDER,
}


def hostile_payload(kind: str, mid: str, *, rogue_host: str, claimed_host: str) -> Any:
    """A payload of one of ``HOSTILE_KINDS``, written by ``rogue_host``; ``forged_host`` claims
    to come from ``claimed_host``."""
    if kind == "string":
        return "just a string"
    if kind == "null":
        return None
    if kind == "array":
        return [1, 2, 3]
    if kind == "id_object":
        return rogue_message(new_id(), rogue_host, mid=mid, id={"x": 1})
    if kind == "text_number":
        return rogue_message(new_id(), rogue_host, mid=mid, message=12345)
    assert kind == "forged_host", kind
    return rogue_message(new_id(), claimed_host, mid=mid)


def host_row_free(url: str, host_id: str, wait_s: float) -> bool:
    """True when a writer gets ``host_id``'s row within ``wait_s`` (on SQLite: the whole file,
    readers included, as the rollback journal's writers need it)."""
    parsed = parse_store_url(url)
    if parsed.kind == "sqlite":
        assert parsed.path is not None
        raw = sqlite3.connect(parsed.path, timeout=wait_s, isolation_level=None)
        try:
            raw.execute(q.SQLITE_BEGIN_EXCLUSIVE)
            raw.execute(q.SQLITE_ROLLBACK)
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            raw.close()
    engine = store_engine(parsed, pool_size=1)
    try:
        with engine.connect() as conn, conn.begin() as txn:
            conn.execute(q.PG_SET_LOCK_TIMEOUT, {"ms": str(int(wait_s * 1000))})
            conn.execute(q.LOCK_HOST_ROW, {"host_id": host_id}).all()
            txn.rollback()
        return True
    except DBAPIError:
        return False
    finally:
        engine.dispose()
