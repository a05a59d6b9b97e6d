"""The dedup authority database's format (docs/delivery.md); its files are ``files``'s.

The database is SQLite marked with ``application_id`` ``CIDA`` and ``user_version``
``SCHEMA_VERSION``, and holds exactly the tables of ``TABLES``. Each ``ops`` row is one record:
the operation id, the hex HMAC of its payload, its state (lodged, stored as ``reserved``, or
accepted with the outcome as a JSON object) and its wall-clock expiry. Every statement on these
tables is here, next to the schema it depends on, with the check that an opened file is one of
ours written with this key (``validate``) and what a stored record must be to be trusted
(``parse_row``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import sqlite3
from pathlib import Path
from typing import Any, NamedTuple

from crossintercom.errors import AuthorityError
from crossintercom.runtime import bound_wal

DB_FILE = "delivered-messages.sqlite"
KEY_FILE = "delivered-messages.key"
KEY_SIZE = 32
HMAC_HEX_LEN = 64
MAX_OP_ID_LEN = 256
SCHEMA_VERSION = 1
# "CIDA": marks the file as ours, so an unrelated SQLite file is not mistaken for an authority.
APPLICATION_ID = 0x43494441
RESET_ADVICE = (
    "run `crossintercom broker --reset-authority` to move the authority files aside "
    "(retries of operations sent before the reset can then be delivered again)"
)
# A lodged record's state as the file stores it (the format's word, kept across versions).
LODGED = "reserved"
ACCEPTED = "accepted"
_KEY_CHECK_LABEL = b"crossintercom dedup authority key check v1"
_HEX_RE = re.compile(f"[0-9a-f]{{{HMAC_HEX_LEN}}}")
# Compared verbatim with sqlite_master: SQLite keeps the CREATE text as written.
TABLES = (
    ("meta", "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"),
    (
        "ops",
        "CREATE TABLE ops (op_id TEXT PRIMARY KEY, hmac TEXT NOT NULL, state TEXT NOT NULL, "
        "outcome TEXT, expires_wall REAL NOT NULL) WITHOUT ROWID",
    ),
)
INSERT_LODGED = (
    "INSERT INTO ops (op_id, hmac, state, outcome, expires_wall) VALUES (?, ?, ?, NULL, ?)"
)
SET_ACCEPTED = "UPDATE ops SET state = ?, outcome = ? WHERE op_id = ?"
DELETE_OP = "DELETE FROM ops WHERE op_id = ?"
SELECT_OUTCOME = "SELECT outcome FROM ops WHERE op_id = ?"


class StoredRecord(NamedTuple):
    """One live ``ops`` row as read on open, its deadline already on the caller's clock."""

    op_id: str
    digest: str
    accepted: bool
    outcome: str | None
    deadline: float


def corrupt(path: Path, why: str) -> AuthorityError:
    return AuthorityError(f"{path}: {why}; {RESET_ADVICE}", path=str(path))


def key_check(key: bytes) -> str:
    return hmac.new(key, _KEY_CHECK_LABEL, hashlib.sha256).hexdigest()


def validate(conn: sqlite3.Connection, path: Path, key_path: Path, key: bytes) -> None:
    """The database is an authority's of this schema, written with ``key``; switched to WAL."""
    # Exclusive locking: we are the only user of this file, and the in-memory mirror
    # relies on that. It also keeps the WAL index in process memory (no -shm file).
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    check = [row[0] for row in conn.execute("PRAGMA quick_check")]
    if check != ["ok"]:
        raise corrupt(path, f"fails its integrity check ({'; '.join(map(str, check[:3]))})")
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if app_id != APPLICATION_ID:
        raise corrupt(path, "is not a crossintercom dedup authority database")
    if version != SCHEMA_VERSION:
        raise corrupt(path, f"has schema version {version}, expected {SCHEMA_VERSION}")
    schema = conn.execute(
        "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
    ).fetchall()
    if schema != [("table", name, ddl) for name, ddl in TABLES]:
        raise corrupt(path, "has an unexpected schema")
    stored = dict(conn.execute("SELECT name, value FROM meta").fetchall())
    check_value = stored.get("key_check")
    if not isinstance(check_value, str) or not hmac.compare_digest(check_value, key_check(key)):
        raise corrupt(key_path, f"is not the key {DB_FILE} was written with")

    journal = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(journal).lower() != "wal":
        raise corrupt(path, f"cannot be switched to WAL mode (got {journal})")
    conn.execute("PRAGMA synchronous=NORMAL")
    bound_wal(conn)


def parse_row(
    path: Path, row: tuple[Any, ...], now_wall: float, ttl: float
) -> tuple[str, str, bool, str | None, float]:
    """Validate one ``ops`` row; return (op_id, hmac, accepted, outcome, remaining lifetime)."""
    op_id, digest, state, outcome, expires_wall = row

    def bad(why: str) -> AuthorityError:
        return corrupt(path, f"corrupt record {str(op_id)[:80]!r}: {why}")

    if not isinstance(op_id, str) or not op_id or len(op_id) > MAX_OP_ID_LEN:
        raise bad("invalid operation id")
    if not isinstance(digest, str) or not _HEX_RE.fullmatch(digest):
        raise bad("invalid payload hmac")
    if state == LODGED:
        if outcome is not None:
            raise bad("a lodged record carries an outcome")
    elif state == ACCEPTED:
        if not isinstance(outcome, str):
            raise bad("accepted without an outcome")
        try:
            parsed = json.loads(outcome)
        except ValueError:
            raise bad("outcome is not valid JSON") from None
        if not isinstance(parsed, dict):
            raise bad("outcome is not a JSON object")
    else:
        raise bad(f"unknown state {str(state)[:20]!r}")
    if (
        not isinstance(expires_wall, int | float)
        or isinstance(expires_wall, bool)
        or not math.isfinite(expires_wall)
    ):
        raise bad("invalid expiry")
    remaining = min(max(expires_wall - now_wall, 0.0), ttl)
    return op_id, digest, state == ACCEPTED, outcome, remaining
