"""Every statement the store runs, by name, in one place.

Statements are SQLAlchemy Core, built here and executed by the backends. The few that are
dialect-specific (upserts, NOTIFY, advisory locks, ``SKIP LOCKED``) say so in their name or
take the dialect name. Plain Core that one dialect ignores (``FOR UPDATE`` on SQLite, where
``BEGIN IMMEDIATE`` already serialises writers) stays shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Delete,
    LargeBinary,
    Select,
    Text,
    TextClause,
    Update,
    all_,
    bindparam,
    case,
    cast,
    column,
    delete,
    exists,
    func,
    literal_column,
    or_,
    select,
    table,
    text,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.expression import ColumnClause

from crossintercom.errors import Code
from crossintercom.models import PROGRESS, DeliveryState, ReceiptOutcome, State
from crossintercom.search_model import MARK_END, MARK_START, SearchQuery, search_terms
from crossintercom.storage.tables import (
    ARCHIVE_FTS_TABLE,
    ERROR_CHARS,
    ERROR_CODE_CHARS,
    HOST_ID_CHARS,
    TS_CONFIG,
    VERSION_CHARS,
    archive_messages,
    archive_recipients,
    archive_settings,
    deliveries,
    host_roles,
    hosts,
    messages,
    receipts,
    reservations,
    roster,
    settings,
)

# Statements are built once, with bound parameters, and reused: building and hashing a Core
# statement per call cost more than the round trip of a one-row statement. The functions that
# take a dialect or a shape are cached per argument for the same reason.


# A literal, never a bound parameter: the partial indexes on ``state = 'queued'`` only serve a
# query whose plan knows the value (a generic plan of a prepared statement with a parameter
# fell back to a sequential scan: 11 ms against 0.17 on 36k rows).
QUEUED: ColumnClause[Any] = literal_column("'queued'")


def _insert(dialect: str, table: Any) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


def _in_keys(dialect: str) -> Any:
    """``(message_id, recipient_session)`` is one of the batch's keys (see ``key_params``).

    PostgreSQL gets two arrays: one statement text whatever the batch size, and a semi-join
    the planner runs through the unique index, where an IN list of 1,000 pairs became 1,000
    OR-ed conditions (~200 ms). SQLite gets an expanding IN list of row values.
    """
    key = tuple_(deliveries.c.message_id, deliveries.c.recipient_session)
    if dialect == "postgresql":
        return key.in_(
            select(
                func.unnest(bindparam("key_mids", type_=postgresql.ARRAY(Text))),
                func.unnest(bindparam("key_sessions", type_=postgresql.ARRAY(Text))),
            )
        )
    return key.in_(bindparam("keys", expanding=True))


def _in_seqs(dialect: str) -> Any:
    """``seq`` is one of ``:seqs`` (a list): one array on PostgreSQL (one statement text
    whatever the batch size, as ``_in_keys``), an expanding IN list on SQLite."""
    if dialect == "postgresql":
        return deliveries.c.seq == func.any(bindparam("seqs", type_=postgresql.ARRAY(BigInteger)))
    return deliveries.c.seq.in_(bindparam("seqs", expanding=True))


def key_params(dialect: str, keys: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The parameters ``_in_keys`` reads."""
    if dialect == "postgresql":
        return {"key_mids": [k[0] for k in keys], "key_sessions": [k[1] for k in keys]}
    return {"keys": list(keys)}


def _current(host_param: str = "host_id") -> Any:
    """True while ``:generation`` is still the host's current one (reads are fenced by it)."""
    return exists().where(
        hosts.c.host_id == bindparam(host_param), hosts.c.generation == bindparam("generation")
    )


# -- hosts, fencing, liveness ---------------------------------------------------------------


@cache
def claim_host(dialect: str) -> Any:
    """generation := generation + 1, creating the host row on first start. Params: host_id."""
    stmt = _insert(dialect, hosts).values(host_id=bindparam("host_id"), generation=1, heartbeat=0)
    return stmt.on_conflict_do_update(
        index_elements=[hosts.c.host_id],
        set_={"generation": hosts.c.generation + 1},
    ).returning(hosts.c.generation)


# Params: host, gen (an UPDATE may not bind its own column names).
HEARTBEAT: Update = (
    update(hosts)
    .where(hosts.c.host_id == bindparam("host"), hosts.c.generation == bindparam("gen"))
    .values(heartbeat=hosts.c.heartbeat + 1)
)

# The machine holding a host id, and its heartbeat (a collision check before a claim).
# Params: host_id.
HOST_CLAIM: Select[str | None, int] = select(hosts.c.machine, hosts.c.heartbeat).where(
    hosts.c.host_id == bindparam("host_id")
)

# Recorded with the claim, in its transaction: the machine (kept as it was when none is
# named) and the relay's version. Params: host, gen, machine, version.
SET_HOST_CLAIM: Update = (
    update(hosts)
    .where(hosts.c.host_id == bindparam("host"), hosts.c.generation == bindparam("gen"))
    .values(
        machine=func.coalesce(bindparam("machine", type_=Text), hosts.c.machine),
        version=bindparam("version", type_=Text),
    )
)

# The relay's last error, written only when it changed, with the database's time; fenced.
# Params: host, gen, code, error.
SET_HOST_ERROR: Update = (
    update(hosts)
    .where(hosts.c.host_id == bindparam("host"), hosts.c.generation == bindparam("gen"))
    .values(
        last_error_code=bindparam("code", type_=Text),
        last_error=bindparam("last_error", type_=Text),
        last_error_at=func.now(),
    )
)

# With when each heartbeat last moved and the database's "now", both by the database's clock.
LIST_HOSTS: Select[str, int, int, int, Any, Any] = select(
    hosts.c.host_id,
    hosts.c.generation,
    hosts.c.heartbeat,
    hosts.c.roster_rev,
    type_coerce(hosts.c.beat_at, Text),  # as stored (SQLite: any text a writer put there)
    func.now(),
).order_by(hosts.c.host_id)


@cache
def host_reports(dialect: str) -> Select[Any]:
    """``LIST_HOSTS`` and what each host wrote of itself (`status --all-hosts`): version, last
    error code, message and time. Another host's words: each text cut in the statement to one
    past its column's bound (SQLite keeps any length a writer stored) and, on SQLite, read as
    its bytes, for storage/rowcheck.py to check."""
    raw = dialect == "sqlite"

    def cut(c: Any, chars: int) -> Any:
        short = func.substr(c, 1, chars + 1)
        return cast(short, LargeBinary) if raw else short

    h = hosts.c
    return LIST_HOSTS.add_columns(
        cut(h.version, VERSION_CHARS),
        cut(h.last_error_code, ERROR_CODE_CHARS),
        cut(h.last_error, ERROR_CHARS),
        # PostgreSQL keeps only a time here; SQLite whatever a writer put, at most 64 read.
        cut(h.last_error_at, 64) if raw else type_coerce(h.last_error_at, Text),
    )


def queued_mail(one_host: bool) -> Select[str, int, Any, Any]:
    """Mail waiting in the store for each host (or the one host ``:host``): how many rows and
    when the oldest was written, with the database's now (`status --all-hosts`, the relay's
    queue gauges). One grouped read, not a statement per message."""
    stmt = (
        select(
            deliveries.c.recipient_host,
            func.count(),
            type_coerce(func.min(messages.c.created), Text),  # as stored, like LIST_HOSTS
            func.now(),
        )
        .select_from(deliveries.join(messages, messages.c.message_id == deliveries.c.message_id))
        .where(deliveries.c.state == State.QUEUED.value)
        .group_by(deliveries.c.recipient_host)
    )
    return stmt.where(deliveries.c.recipient_host == bindparam("host")) if one_host else stmt


# The host's live reservations at its generation, by mode (the relay's reservation gauges,
# at every heartbeat while metrics are served): one grouped read. Params: host, gen, now.
RESERVATION_COUNTS: Select[str, int] = (
    select(reservations.c.mode, func.count())
    .where(
        reservations.c.host_id == bindparam("host"),
        reservations.c.generation == bindparam("gen"),
        reservations.c.expires_at > bindparam("now"),
    )
    .group_by(reservations.c.mode)
)


# A roster change of the host, fenced: the UPDATE's row lock makes a concurrent claim_host
# wait, as the share lock of CURRENT_GENERATION does. Params: host, gen.
BUMP_ROSTER_REV: Update = (
    update(hosts)
    .where(hosts.c.host_id == bindparam("host"), hosts.c.generation == bindparam("gen"))
    .values(roster_rev=hosts.c.roster_rev + 1)
)


def _session_in(dialect: str) -> Any:
    """``recipient_session`` is one of ``:sessions``: an array on PostgreSQL (one statement
    text whatever the count), an expanding IN list on SQLite."""
    if dialect == "postgresql":
        return deliveries.c.recipient_session == func.any(
            bindparam("sessions", type_=postgresql.ARRAY(Text))
        )
    return deliveries.c.recipient_session.in_(bindparam("sessions", expanding=True))


def sessions_param(session_ids: list[str]) -> dict[str, Any]:
    """The parameter ``_session_in`` reads (a list for either dialect)."""
    return {"sessions": session_ids}


@cache
def beat(dialect: str, *, archive: bool = True) -> Select[Any]:
    """Every host's lease row and roster revision, with whether queued deliveries (for
    ``:sessions``) and receipts wait for ``:host`` and whether the archive is on: the
    heartbeat's answer (``Beat``). On PostgreSQL the heartbeat bump itself is in the
    statement (last column: 1 while ``:gen`` is current, else 0), one statement and one
    commit a beat (heartbeat_s); SQLite runs HEARTBEAT first.
    Params: host, gen, sessions."""
    waiting = exists().where(
        deliveries.c.recipient_host == bindparam("host"),
        deliveries.c.state == QUEUED,
        _session_in(dialect),
    )
    receipts_waiting = exists().where(receipts.c.sender_host == bindparam("host"))
    if dialect == "postgresql":
        bumped = HEARTBEAT.returning(hosts.c.host_id).cte("bumped")
        current: Any = select(func.count()).select_from(bumped).scalar_subquery()
    else:
        current = literal_column("1")
    # NULL where the role may not read the archive's tables (a per-host role).
    archive_on: Any = (
        select(archive_settings.c.enabled).where(archive_settings.c.id == 1).scalar_subquery()
        if archive
        else literal_column("NULL")
    )
    return select(
        hosts.c.host_id,
        hosts.c.generation,
        hosts.c.heartbeat,
        hosts.c.roster_rev,
        waiting,
        receipts_waiting,
        archive_on,
        current,
    ).order_by(hosts.c.host_id)


# Read under a share lock, so a concurrent ``claim_host`` waits until this write ends: a write
# conditioned on generation g is never committed after g + 1 was handed out. Params: host_id.
CURRENT_GENERATION: Select[int] = (
    select(hosts.c.generation)
    .where(hosts.c.host_id == bindparam("host_id"))
    .with_for_update(read=True)
)


# -- roster --------------------------------------------------------------------------------

DELETE_ROSTER: Delete = delete(roster).where(roster.c.host_id == bindparam("host_id"))
# `forget`: one session's row goes at once, before the relay's next publish. Params: host_id,
# session_id.
DELETE_ROSTER_SESSION: Delete = delete(roster).where(
    roster.c.host_id == bindparam("host_id"), roster.c.session_id == bindparam("session_id")
)


@cache
def insert_roster(dialect: str) -> Any:
    """Run with a list of rows; returns the session ids inserted. A session id another host
    holds already is left to it (the first claim wins: the unique index uq_roster_session_id)."""
    return (
        _insert(dialect, roster)
        .on_conflict_do_nothing(index_elements=[roster.c.session_id])
        .returning(roster.c.session_id)
    )


# ``groups`` as stored (the driver's JSON decoding off): a writer of a SQLite file can store
# anything in it, and one value that is not JSON failed the whole read; the rows are checked
# one by one (hosts.roster).
# Each host's first :per_host rows only (by session id), and how many it has (``host_rows``):
# a host may publish any number of its own rows, and every other host's relay hands them all
# to its broker in one frame (docs/operations.md, "Trust model"). Params: per_host.
_ROSTER_RANKED = select(
    *(type_coerce(c, Text).label(c.name) if c.name == "groups" else c for c in roster.c),
    func.row_number()
    .over(partition_by=roster.c.host_id, order_by=roster.c.session_id)
    .label("host_rank"),
    func.count().over(partition_by=roster.c.host_id).label("host_rows"),
).subquery()
LIST_ROSTER: Select[Any] = (
    select(*(c for c in _ROSTER_RANKED.c if c.name != "host_rank"))
    .where(_ROSTER_RANKED.c.host_rank <= bindparam("per_host"))
    .order_by(_ROSTER_RANKED.c.host_id, _ROSTER_RANKED.c.session_id)
)


# -- messages and deliveries -----------------------------------------------------------------


@cache
def insert_messages_if_absent(dialect: str) -> Any:
    """Run with a list of rows (one multi-row INSERT); returns the ids actually inserted."""
    return (
        _insert(dialect, messages)
        .on_conflict_do_nothing(index_elements=[messages.c.message_id])
        .returning(messages.c.message_id)
    )


@cache
def insert_deliveries_if_absent(dialect: str) -> Any:
    """Run with a list of rows; returns (seq, message_id, recipient_session) of the new ones,
    nothing for a (message, recipient) pair that already existed. Rows get their seq in list
    order (one multi-row INSERT)."""
    return (
        _insert(dialect, deliveries)
        .on_conflict_do_nothing(
            index_elements=[deliveries.c.message_id, deliveries.c.recipient_session]
        )
        .returning(deliveries.c.seq, deliveries.c.message_id, deliveries.c.recipient_session)
    )


# Params: message_id.
MESSAGE_DIGEST: Select[str] = select(messages.c.digest).where(
    messages.c.message_id == bindparam("message_id")
)

# Params: message_ids (a list).
MESSAGE_DIGESTS: Select[str, str] = select(messages.c.message_id, messages.c.digest).where(
    messages.c.message_id.in_(bindparam("message_ids", expanding=True))
)


@cache
def delivery_states(dialect: str) -> Select[str, str, DeliveryState]:
    """Params: ``key_params``."""
    return select(
        deliveries.c.message_id, deliveries.c.recipient_session, deliveries.c.state
    ).where(_in_keys(dialect))


# Params: message_id.
MESSAGE_STATES: Select[str, DeliveryState] = select(
    deliveries.c.recipient_session, deliveries.c.state
).where(deliveries.c.message_id == bindparam("message_id"))


# The payload as its stored text: decoded by the caller row by row, so one row that is not
# JSON (a stray writer on SQLite) is refused alone instead of failing the whole read.
_PAYLOAD_TEXT = cast(messages.c.payload, Text)
# SQLite hands TEXT over decoded: one value that is not UTF-8 failed the whole result set. Read
# as its bytes, it is decoded row by row as well (docs/storage.md, "Delivery states").
_PAYLOAD_BYTES = cast(messages.c.payload, LargeBinary)


@cache
def inbound(
    *,
    by_session: bool,
    array: bool = False,
    raw: bool = False,
    skip: bool = False,
) -> Select[int, str | bytes, str | bytes, str | bytes | None, str | bytes, int, str | bytes]:
    """Queued rows for one host, by state and in seq order, only for its current generation:
    seq, message_id, recipient_session, payload text (NULL when over ``:max_payload``
    characters, so an oversized row costs no memory; its bytes when ``raw``, for SQLite),
    sender_host, payload length, digest (the sender's, checked by the receiver); with ``raw``
    the message id, session, sender and digest are bytes too: a writer may store a BLOB or
    text that is not UTF-8 in any column, and one such value failed the whole read (or the
    relay).

    Params: host_id, generation, limit, max_payload, and session_ids (a list) when
    ``by_session``, bound as one array when ``array`` (PostgreSQL). Never ``seq > cursor``:
    sequences commit out of order, so a cursor would skip late commits. With ``skip``, the
    rows whose seq is in ``:skip_seqs`` (a list; one array when ``array``) are left out in the
    statement: the relay's read ahead names the rows it is handing over and those of its ack
    under way, so only new rows are transferred and decoded (docs/perf-log/2026-12.md, "Catch-up:
    the read ahead and the stored text passed through").
    """
    length = func.length(_PAYLOAD_TEXT)
    stmt = (
        select(
            deliveries.c.seq,
            cast(deliveries.c.message_id, LargeBinary) if raw else deliveries.c.message_id,
            cast(deliveries.c.recipient_session, LargeBinary)
            if raw
            else deliveries.c.recipient_session,
            case(
                (length <= bindparam("max_payload"), _PAYLOAD_BYTES if raw else _PAYLOAD_TEXT),
                else_=None,
            ),
            # Raw: at most one character past a host id's longest (a longer one is refused).
            cast(func.substr(messages.c.sender_host, 1, HOST_ID_CHARS + 1), LargeBinary)
            if raw
            else messages.c.sender_host,
            length,
            cast(messages.c.digest, LargeBinary) if raw else messages.c.digest,
        )
        .join(messages, messages.c.message_id == deliveries.c.message_id)
        .where(
            deliveries.c.recipient_host == bindparam("host_id"),
            deliveries.c.state == QUEUED,
            _current(),
        )
        .order_by(deliveries.c.seq)
        .limit(bindparam("limit"))
    )
    if by_session and array:
        stmt = stmt.where(
            deliveries.c.recipient_session
            == func.any(bindparam("session_ids", type_=postgresql.ARRAY(Text)))
        )
    elif by_session:
        stmt = stmt.where(
            deliveries.c.recipient_session.in_(bindparam("session_ids", expanding=True))
        )
    if skip and array:
        stmt = stmt.where(
            deliveries.c.seq != all_(bindparam("skip_seqs", type_=postgresql.ARRAY(BigInteger)))
        )
    elif skip:
        stmt = stmt.where(deliveries.c.seq.not_in(bindparam("skip_seqs", expanding=True)))
    return stmt


# queued → delivered/refused for a list of (message_id, recipient_session) keys that share one
# outcome, or of seqs (``by_seq``: the rows as read, whatever a writer stored in their keys);
# matches nothing for a row already finished (idempotent ack). Returns the seqs it changed.
# Params: host_id, new_state, new_reason, finished and ``key_params`` (or seqs, a list).
@cache
def finish_deliveries(dialect: str, by_seq: bool = False) -> Any:
    return (
        update(deliveries)
        .where(
            _in_seqs(dialect) if by_seq else _in_keys(dialect),
            deliveries.c.recipient_host == bindparam("host_id"),
            deliveries.c.state == QUEUED,
        )
        .values(
            state=bindparam("new_state"),
            reason=bindparam("new_reason"),
            finished_at=bindparam("finished"),
        )
        .returning(deliveries.c.seq)
    )


# One receipt per finished delivery among ``seqs``, for the sender's host, in seq order: the
# outcome is the delivery's new state and the code its reason. By seq, not by key: a key a
# writer stored as a BLOB or as text that is not UTF-8 is matched all the same (SQLite).
# Returns the sender hosts (to wake). Params: created, seqs (a list; one array on PostgreSQL).
@cache
def receipts_for_finished(dialect: str) -> Any:
    return (
        receipts.insert()
        .from_select(
            [
                "sender_host",
                "message_id",
                "recipient_session",
                "recipient_host",
                "outcome",
                "code",
                "created",
            ],
            select(
                messages.c.sender_host,
                deliveries.c.message_id,
                deliveries.c.recipient_session,
                deliveries.c.recipient_host,
                deliveries.c.state,
                deliveries.c.reason,
                bindparam("created", type_=DateTime(timezone=True)),
            )
            .join(messages, messages.c.message_id == deliveries.c.message_id)
            .where(_in_seqs(dialect))
            .order_by(deliveries.c.seq),
        )
        # SQLite: as bytes, so a sender a writer stored as non-UTF-8 fails no ack (sqlstore).
        .returning(
            cast(receipts.c.sender_host, LargeBinary)
            if dialect == "sqlite"
            else receipts.c.sender_host
        )
    )


# Params: host_id, generation, limit. Fenced in the statement itself: nothing for a stale
# generation.
_RECEIPT_TEXTS = (
    receipts.c.message_id,
    receipts.c.recipient_session,
    receipts.c.recipient_host,
    receipts.c.outcome,
    receipts.c.code,
    receipts.c.sender_session,
    receipts.c.note,
)
LIST_RECEIPTS: Select[int, str, str, str, ReceiptOutcome, str | None, str | None, str | None] = (
    select(receipts.c.id, *_RECEIPT_TEXTS)
    .where(receipts.c.sender_host == bindparam("host_id"), _current())
    .order_by(receipts.c.id)
    .limit(bindparam("limit"))
)
# SQLite: ``LIST_RECEIPTS`` with every text read as its bytes. A writer may store a BLOB or text
# that is not UTF-8 in any column, and one such value failed every read of the host's
# receipts; the rows are checked one by one (sqlstore).
SQLITE_LIST_RECEIPTS: Select[Any] = LIST_RECEIPTS.with_only_columns(
    receipts.c.id, *(cast(c, LargeBinary) for c in _RECEIPT_TEXTS)
)

# Receipts a recipient's host writes after its ack (``shown``, a late ``expired``,
# ``acknowledged``), run with a list of rows. The writer is always the recipient's host
# (``recipient_host``); the caller checks its generation in the same transaction. A row is
# written only about a delivery to that host and session (PG_ADD_RECEIPTS's rule): a session
# that never received the message acknowledges nothing (docs/operations.md, "Trust").
_LATE_COLUMNS = (
    "message_id",
    "recipient_session",
    "sender_host",
    "sender_session",
    "outcome",
    "code",
    "note",
    "recipient_host",
    "created",
)
INSERT_LATE_RECEIPTS = receipts.insert().from_select(
    list(_LATE_COLUMNS),
    select(*(bindparam(c, type_=receipts.c[c].type) for c in _LATE_COLUMNS)).where(
        exists().where(
            deliveries.c.message_id == bindparam("message_id"),
            deliveries.c.recipient_session == bindparam("recipient_session"),
            deliveries.c.recipient_host == bindparam("recipient_host"),
        )
    ),
)

# `forget`: what is still queued for one session of the host expires now, with the code
# ``forgotten``. Returns the seqs it changed (their receipts are written next). Params:
# host_id, session_id, finished.
FORGET_DELIVERIES = (
    update(deliveries)
    .where(
        deliveries.c.recipient_host == bindparam("host_id"),
        deliveries.c.recipient_session == bindparam("session_id"),
        deliveries.c.state == QUEUED,
    )
    .values(state=State.EXPIRED.value, reason=Code.FORGOTTEN, finished_at=bindparam("finished"))
    .returning(deliveries.c.seq)
)

# The last seq queued for a host (0: none), read by a relay that took the host id over from
# another machine: rows up to it may have reached that machine's sessions before it froze
# (docs/protocol.md, flag ``possible_repeat``). Params: host_id.
QUEUED_THROUGH: Select[int] = select(func.coalesce(func.max(deliveries.c.seq), 0)).where(
    deliveries.c.recipient_host == bindparam("host_id"), deliveries.c.state == QUEUED
)

# Params: host_id, receipt_ids (a list).
DELETE_RECEIPTS: Delete = delete(receipts).where(
    receipts.c.sender_host == bindparam("host_id"),
    receipts.c.id.in_(bindparam("receipt_ids", expanding=True)),
)


def _expire_batch() -> Update:
    due = (
        select(deliveries.c.seq)
        .where(deliveries.c.state == QUEUED, deliveries.c.expires_at < bindparam("now"))
        .order_by(deliveries.c.seq)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
    )
    return (
        update(deliveries)
        .where(deliveries.c.seq.in_(due.scalar_subquery()), deliveries.c.state == QUEUED)
        .values(state=State.EXPIRED.value, reason=Code.EXPIRED, finished_at=bindparam("finished"))
    )


# Params: now, finished (the same time), limit. Returns the seqs it expired.
EXPIRE_BATCH = _expire_batch().returning(deliveries.c.seq)


# -- purge ---------------------------------------------------------------------------------

# Params: cutoff, limit. Returns the message ids, as bytes on SQLite (``purge_deliveries``).
_PURGE_DELIVERIES = delete(deliveries).where(
    deliveries.c.seq.in_(
        select(deliveries.c.seq)
        .where(deliveries.c.state != QUEUED, deliveries.c.finished_at < bindparam("cutoff"))
        .limit(bindparam("limit"))
        .scalar_subquery()
    )
)


@cache
def purge_deliveries(dialect: str) -> Any:
    """``_PURGE_DELIVERIES`` returning the message ids; as bytes on SQLite, where a writer may
    have stored one that is not UTF-8 (it failed every purge after it)."""
    mid = deliveries.c.message_id
    return _PURGE_DELIVERIES.returning(cast(mid, LargeBinary) if dialect == "sqlite" else mid)


# Drop messages among ``message_ids`` that no delivery row refers to any more.
PURGE_ORPHAN_MESSAGES: Delete = delete(messages).where(
    messages.c.message_id.in_(bindparam("message_ids", expanding=True)),
    ~exists().where(deliveries.c.message_id == messages.c.message_id),
)

# Receipts nobody consumed (their host is gone) go after the retention period.
# Params: cutoff, limit.
PURGE_RECEIPTS: Delete = delete(receipts).where(
    receipts.c.id.in_(
        select(receipts.c.id)
        .where(receipts.c.created < bindparam("cutoff"))
        .limit(bindparam("limit"))
        .scalar_subquery()
    )
)


# -- settings and schema -------------------------------------------------------------------

READ_SETTINGS: Select[int, int] = select(
    settings.c.max_message_bytes, settings.c.retention_s
).where(settings.c.id == 1)
# SQLite: as their bytes, checked by the reader (a writer may store text that is not UTF-8).
SQLITE_READ_SETTINGS: Select[bytes, bytes] = select(
    cast(settings.c.max_message_bytes, LargeBinary), cast(settings.c.retention_s, LargeBinary)
).where(settings.c.id == 1)


def update_settings(values: dict[str, int]) -> Update:
    return update(settings).where(settings.c.id == 1).values(**values)


SCHEMA_VERSION = text("SELECT version_num FROM alembic_version")

# -- path reservations (docs/agents.md#path-reservations) -----------------------------------

# A reservation that may still count: its TTL runs (and ends within the longest TTL a relay
# gives: a host role may store 'infinity' or the year 9999, which no reader could hold as a
# time), it was made under its host's current generation (a relay restart ends what the one
# before made), and its session is on the roster (a forgotten session's go). The holder host's
# lease is judged by the reader, on its own clock (storage/liveness.py). With the holder's name
# for people.
#
# Bounded whatever another host stored (docs/operations.md, "Trust model"): each host's oldest
# :per_host rows at most (``host_rows`` says how many it has, so the reader can name the
# excess), :limit rows in all, and each text cut one character past its longest, so one
# oversized value costs no memory and is left out by the reader alone. The times come as Unix
# seconds on PostgreSQL and as stored on SQLite (every text as bytes there: a writer of the
# file may store any type, or text that is not UTF-8), parsed row by row
# (storage/reservations.py).
RESERVATION_TEXTS = {
    "id": 64,
    "project": 255,
    "glob": 500,
    "host_id": HOST_ID_CHARS,
    "session_id": 128,
    "reason": 500,
}
_NAME_CHARS = 64


@cache
def live_reservations(dialect: str, by_project: bool) -> Select[Any]:
    """Params: now, latest (the latest expiry that can be real), per_host, limit, and project
    when ``by_project``. Columns: id, project, glob, mode, host_id, session_id, expires_at,
    created, reason, name, host_rows."""
    raw = dialect == "sqlite"

    def cut(c: Any, chars: int, name: str) -> Any:
        short = func.substr(c, 1, chars + 1)
        return (cast(short, LargeBinary) if raw else short).label(name)

    def when(c: Any) -> Any:
        return (cast(c, LargeBinary) if raw else func.extract("epoch", c)).label(c.name)

    r = reservations.c
    inner = (
        select(
            *(cut(r[k], n, k) for k, n in RESERVATION_TEXTS.items()),
            cut(r.mode, 16, "mode"),
            when(r.expires_at),
            when(r.created),
            cut(roster.c.name, _NAME_CHARS, "name"),
            r.created.label("created_order"),
            func.row_number()
            .over(partition_by=r.host_id, order_by=(r.created, r.id))
            .label("host_rank"),
            func.count().over(partition_by=r.host_id).label("host_rows"),
        )
        .select_from(
            reservations.join(
                hosts, (hosts.c.host_id == r.host_id) & (hosts.c.generation == r.generation)
            ).join(roster, (roster.c.host_id == r.host_id) & (roster.c.session_id == r.session_id))
        )
        .where(r.expires_at > bindparam("now"), r.expires_at <= bindparam("latest"))
    )
    if by_project:
        inner = inner.where(r.project == bindparam("project"))
    sub = inner.subquery()
    c = sub.c
    return (
        select(
            c.id,
            c.project,
            c.glob,
            c.mode,
            c.host_id,
            c.session_id,
            c.expires_at,
            c.created,
            c.reason,
            c.name,
            c.host_rows,
        )
        .where(c.host_rank <= bindparam("per_host"))
        .order_by(c.created_order, c.id)
        .limit(bindparam("limit"))
    )


# A host's own live reservations, as its quotas count them: how many, and their globs' and
# reasons' characters, of one session (:session_id) or of the whole host (:session_id NULL),
# leaving out the rows of :project and :globs that session :renewer renews. Params: host_id,
# session_id, renewer, project, globs (a list), now.
RESERVATION_USAGE: Select[Any] = select(
    func.count(),
    func.coalesce(
        func.sum(
            func.length(reservations.c.glob) + func.coalesce(func.length(reservations.c.reason), 0)
        ),
        0,
    ),
).where(
    reservations.c.host_id == bindparam("host_id"),
    reservations.c.expires_at > bindparam("now"),
    or_(
        bindparam("session_id", type_=Text).is_(None),
        reservations.c.session_id == bindparam("session_id", type_=Text),
    ),
    ~(
        (reservations.c.project == bindparam("project"))
        & (reservations.c.session_id == bindparam("renewer"))
        & reservations.c.glob.in_(bindparam("globs", expanding=True))
    ),
)

# One reserving transaction per project at a time (PostgreSQL; SQLite's writers are serial):
# two sessions reserving overlapping globs cannot both read "no conflict". The two-key form
# keeps it apart from the migration lock's. Params: project.
PG_RESERVATION_LOCK_KEY = 0x63690011
PG_LOCK_PROJECT: TextClause = text(
    f"SELECT pg_advisory_xact_lock({PG_RESERVATION_LOCK_KEY}, hashtext(:project))"
)

# A session's earlier reservation of the same glob goes before it is made again (renewal).
# Params: project, host_id, session_id, globs (a list).
DROP_SAME_RESERVATIONS: Delete = delete(reservations).where(
    reservations.c.project == bindparam("project"),
    # The renewing host's own rows only: a session of another host registered with the same
    # session id (SQLite, or one shared role) must not delete that host's reservation.
    reservations.c.host_id == bindparam("host_id"),
    reservations.c.session_id == bindparam("session_id"),
    reservations.c.glob.in_(bindparam("globs", expanding=True)),
)

# Made fenced in the statement: nothing is inserted unless :generation is still the host's
# current one (the host row read under a share lock, as CURRENT_GENERATION). Run with a list
# of rows: id, project, glob, mode, session_id, reason, created, expires_at, and host_id,
# generation.
INSERT_RESERVATION = reservations.insert().from_select(
    [
        "id",
        "project",
        "glob",
        "mode",
        "host_id",
        "session_id",
        "generation",
        "reason",
        "created",
        "expires_at",
    ],
    select(
        bindparam("id", type_=Text),
        bindparam("project", type_=Text),
        bindparam("glob", type_=Text),
        bindparam("mode", type_=Text),
        hosts.c.host_id,
        bindparam("session_id", type_=Text),
        hosts.c.generation,
        bindparam("reason", type_=Text),
        bindparam("created", type_=DateTime(timezone=True)),
        bindparam("expires_at", type_=DateTime(timezone=True)),
    )
    .where(hosts.c.host_id == bindparam("host_id"), hosts.c.generation == bindparam("generation"))
    .with_for_update(read=True),
)

# `unreserve`: a session's reservations of a project, all or those of :globs. Params:
# host_id, session_id, project (and globs, a list).
RELEASE_ALL_RESERVATIONS: Delete = delete(reservations).where(
    reservations.c.host_id == bindparam("host_id"),
    reservations.c.session_id == bindparam("session_id"),
    reservations.c.project == bindparam("project"),
)
RELEASE_RESERVATIONS: Delete = RELEASE_ALL_RESERVATIONS.where(
    reservations.c.glob.in_(bindparam("globs", expanding=True))
)

# `forget`: the session's reservations go with it. Params: host_id, session_id.
FORGET_RESERVATIONS: Delete = delete(reservations).where(
    reservations.c.host_id == bindparam("host_id"),
    reservations.c.session_id == bindparam("session_id"),
)

# The host's own reservations that no longer count: past their TTL, of an older generation,
# or of a session no longer on its roster. Params: host_id, generation, now.
SWEEP_RESERVATIONS: Delete = delete(reservations).where(
    reservations.c.host_id == bindparam("host_id"),
    (reservations.c.expires_at <= bindparam("now"))
    | (reservations.c.generation != bindparam("generation"))
    | ~exists().where(
        roster.c.host_id == reservations.c.host_id,
        roster.c.session_id == reservations.c.session_id,
    ),
)


# -- PostgreSQL only -------------------------------------------------------------------------

# One statement wakes every host of a transaction; sent at commit, once per channel and kind.
# Params: channels (a list), kind (what to look at, storage.wakeup).
PG_NOTIFY: TextClause = text(
    "SELECT pg_notify(channel, :kind) FROM unnest(CAST(:channels AS text[])) AS channel"
)


def pg_deallocate_all(n: int) -> str:
    """A connection's prepared statements dropped, to be planned again (storage/plans.py).
    A new text each time (``n``, the connection's count of them): psycopg forgets what it had
    prepared when it sees this statement's result, but reads it only for a text new to it."""
    return f"DEALLOCATE ALL /* refresh {n} */"


# True when row-level security applies to the connected role (a per-host role).
PG_ROW_SECURITY: TextClause = text("SELECT row_security_active('deliveries')")
# True once the store has per-host roles (storage/schema): a hint's rows are then never taken.
PG_PRIVATE_HINTS: TextClause = text("SELECT public.crossintercom_private_hints()")
# Whether the connected role may read the archive's setting (per-host roles may not).
PG_ARCHIVE_READABLE: TextClause = text("SELECT has_table_privilege('archive_settings', 'SELECT')")

# -- PostgreSQL: the delivery path, one statement each -----------------------------------------
# Each of these is one statement and so one commit: the fence is a FOR SHARE read of the host
# row inside it (a concurrent claim_host waits for it, as for CURRENT_GENERATION), lists are
# arrays (one statement text whatever the batch size), ``'queued'`` is a literal (the partial
# indexes), and the NOTIFY is sent from the statement itself (delivered at its commit).

# A host id's NOTIFY channel, as wakeup.channel_name computes it.
_PG_CHANNEL = "'ci_' || left(encode(sha256(convert_to({}, 'UTF8')), 'hex'), 16)"
# A NOTIFY payload is at most 8,000 bytes: a receipts hint longer than this names its kind only.
PG_HINT_MAX_BYTES = 7000
_PG_FENCE = """cur AS (
    SELECT 1 FROM hosts WHERE host_id = :host_id AND generation = :generation FOR SHARE
)"""
# Receipts just written (CTE ``made``), carried as JSON (wakeup.RECEIPT_ROWS) in one NOTIFY
# per sender host and PG_HINT_ROWS receipts (a batch of 500 acks would not fit one payload, and
# a kind-only hint costs the sender's relay a read), or only their kind when that would be too
# long.
PG_HINT_ROWS = 32
# Any role may LISTEN on any channel: once the store has per-host roles, hints carry their kind
# only, never rows (docs/storage.md, "Wake-ups").
_PG_RECEIPT_HINTS = f"""private_hints AS (
    SELECT public.crossintercom_private_hints() AS private
), hints AS (
    SELECT sender_host, CAST(json_agg(json_build_array(
        id, message_id, recipient_session, recipient_host, outcome, code, sender_session, note
    ) ORDER BY id) AS text) AS body
    FROM (SELECT made.*, (row_number() OVER (PARTITION BY sender_host ORDER BY id) - 1)
                         / {PG_HINT_ROWS} AS part
          FROM made) AS parts
    GROUP BY sender_host, part
), woken AS (
    SELECT count(pg_notify({_PG_CHANNEL.format("sender_host")},
        CASE WHEN (SELECT private FROM private_hints) THEN 'r'
             WHEN octet_length(body) <= {PG_HINT_MAX_BYTES} THEN 'R' || body
             ELSE 'r' END)) AS n
    FROM hints
)"""
_PG_RECEIPT_COLUMNS = (
    "id, sender_host, message_id, recipient_session, recipient_host, outcome, code, "
    "sender_session, note"
)

# queued → delivered/refused for the acked keys (first ack of a key only: the caller dedups),
# a receipt per finished row for its sender's host in seq order, the hints. Returns (finished,
# current). Params: host_id, generation, finished, rows (a JSON array of [message_id,
# recipient_session, state, code] arrays).
PG_ACK: TextClause = text(f"""WITH {_PG_FENCE}, acks AS (
    SELECT r->>0 AS message_id, r->>1 AS recipient_session, r->>2 AS state, r->>3 AS reason
    FROM json_array_elements(CAST(:rows AS json)) AS r
), done AS (
    UPDATE deliveries AS d SET state = a.state, reason = a.reason, finished_at = :finished
    FROM acks AS a, cur
    WHERE d.message_id = a.message_id AND d.recipient_session = a.recipient_session
      AND d.recipient_host = :host_id AND d.state = 'queued'
    RETURNING d.seq, d.message_id, d.recipient_session, d.recipient_host, d.state, d.reason
), made AS (
    INSERT INTO receipts
        (sender_host, message_id, recipient_session, recipient_host, outcome, code, created)
    SELECT m.sender_host, done.message_id, done.recipient_session, done.recipient_host,
           done.state, done.reason, :finished
    FROM done JOIN messages AS m ON m.message_id = done.message_id
    ORDER BY done.seq
    RETURNING {_PG_RECEIPT_COLUMNS}
), {_PG_RECEIPT_HINTS}
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM cur), (SELECT n FROM woken)""")

# Late receipts (``add_receipts``) written as the recipient's host, in order, with their hints.
# Returns (written, current). Params: host_id, generation, created, and rows: a JSON array of
# [message_id, recipient_session, sender_host, sender_session, outcome, code, note] arrays.
PG_ADD_RECEIPTS: TextClause = text(f"""WITH {_PG_FENCE}, made AS (
    INSERT INTO receipts (message_id, recipient_session, sender_host, sender_session, outcome,
                          code, note, recipient_host, created)
    SELECT r.message_id, r.recipient_session, r.sender_host, r.sender_session, r.outcome,
           r.code, r.note, :host_id, :created
    FROM (SELECT e->>0 AS message_id, e->>1 AS recipient_session, e->>2 AS sender_host,
                 e->>3 AS sender_session, e->>4 AS outcome, e->>5 AS code, e->>6 AS note,
                 n AS ord
          FROM json_array_elements(CAST(:rows AS json)) WITH ORDINALITY AS j(e, n)) AS r,
        cur
    -- Only about a delivery this host has (the receipts policy's own rule): a purged one's
    -- notice is dropped here instead of refusing the batch.
    WHERE EXISTS (SELECT 1 FROM deliveries AS d
                  WHERE d.message_id = r.message_id AND d.recipient_session = r.recipient_session
                    AND d.recipient_host = :host_id)
    ORDER BY r.ord
    RETURNING {_PG_RECEIPT_COLUMNS}
), {_PG_RECEIPT_HINTS}
SELECT (SELECT count(*) FROM made), (SELECT count(*) FROM cur), (SELECT n FROM woken)""")

# Handled receipts deleted, fenced. Params: host_id, generation, ids (an array).
PG_CONSUME_RECEIPTS: TextClause = text(f"""WITH {_PG_FENCE}
DELETE FROM receipts USING cur
WHERE receipts.sender_host = :host_id AND receipts.id = ANY(CAST(:ids AS bigint[]))""")


# The whole enqueue in one statement: messages (the first item of an id holds the payload)
# and deliveries inserted if absent, the digests and states of rows that already existed read
# in the same snapshot, the recipients woken. One row per item, in order: ord, current (0 when
# fenced: nothing was written), message inserted, the existing message's digest, delivery
# inserted, the existing delivery's state. A row made by a transaction that committed while
# this one waited on it is in neither (not in this statement's snapshot): the caller reads
# those again in a new statement (batches.enqueue_batch). Params: host_id (the sender),
# generation, now, expires, the arrays mids, rhosts, rsessions, digests, sizes, and payloads:
# one JSON array of the payloads (a text[] of JSON texts costs the driver a regex escape per
# quote of every payload: 20% of a busy relay, docs/performance.md).
@cache
def pg_enqueue(fenced: bool) -> TextClause:
    """The statement above; unfenced (no ``:generation``: an operator's or a test's enqueue)
    it writes whatever host row there is."""
    fence = _PG_FENCE if fenced else "cur AS (SELECT 1)"
    return text(_PG_ENQUEUE.replace("{fence}", fence))


_PG_ENQUEUE = f"""WITH {{fence}}, items AS (
    SELECT * FROM unnest(CAST(:mids AS text[]), CAST(:rhosts AS text[]),
                         CAST(:rsessions AS text[]), CAST(:digests AS text[]),
                         ARRAY(SELECT p.e FROM json_array_elements(CAST(:payloads AS json))
                               WITH ORDINALITY AS p(e, n) ORDER BY p.n),
                         CAST(:sizes AS bigint[])) WITH ORDINALITY
        AS i(message_id, recipient_host, recipient_session, digest, payload, size, ord)
), firsts AS (
    SELECT DISTINCT ON (message_id) message_id, digest, payload, size
    FROM items ORDER BY message_id, ord
), new_messages AS (
    INSERT INTO messages (message_id, sender_host, digest, payload, size, created)
    SELECT f.message_id, :host_id, f.digest, CAST(f.payload AS json), f.size, :now
    FROM firsts AS f, cur
    ON CONFLICT (message_id) DO NOTHING
    RETURNING message_id
), old_messages AS (
    SELECT m.message_id, m.digest FROM messages AS m
    WHERE m.message_id = ANY(CAST(:mids AS text[]))
), wanted AS (
    SELECT DISTINCT ON (i.message_id, i.recipient_session) i.*
    FROM items AS i
    LEFT JOIN firsts AS f ON f.message_id = i.message_id
    LEFT JOIN old_messages AS o ON o.message_id = i.message_id
    WHERE (i.message_id IN (SELECT message_id FROM new_messages) AND i.digest = f.digest)
       OR i.digest = o.digest
    ORDER BY i.message_id, i.recipient_session, i.ord
), new_deliveries AS (
    INSERT INTO deliveries (message_id, recipient_host, recipient_session, state, expires_at)
    SELECT w.message_id, w.recipient_host, w.recipient_session, 'queued', :expires
    FROM wanted AS w, cur
    ORDER BY w.ord
    ON CONFLICT (message_id, recipient_session) DO NOTHING
    RETURNING message_id, recipient_session, recipient_host
), old_deliveries AS (
    SELECT d.message_id, d.recipient_session, d.state FROM deliveries AS d
    WHERE (d.message_id, d.recipient_session) IN (
        SELECT message_id, recipient_session FROM items)
), woken AS (
    SELECT count(pg_notify({_PG_CHANNEL.format("recipient_host")}, 'd')) AS n
    FROM (SELECT DISTINCT recipient_host FROM new_deliveries) AS h
)
SELECT i.ord, (SELECT count(*) FROM cur),
       i.message_id IN (SELECT message_id FROM new_messages),
       o.digest,
       EXISTS (SELECT 1 FROM new_deliveries AS n
               WHERE n.message_id = i.message_id AND n.recipient_session = i.recipient_session),
       od.state,
       (SELECT n FROM woken)
FROM items AS i
LEFT JOIN old_messages AS o ON o.message_id = i.message_id
LEFT JOIN old_deliveries AS od
    ON od.message_id = i.message_id AND od.recipient_session = i.recipient_session
ORDER BY i.ord"""


# Serialises concurrent `db upgrade` runs; the key is arbitrary but fixed forever.
PG_MIGRATION_LOCK_KEY = 0x63690001
PG_ADVISORY_LOCK = text("SELECT pg_advisory_lock(:key)")
PG_ADVISORY_UNLOCK = text("SELECT pg_advisory_unlock(:key)")


# Per-host roles (`crossintercom db grant-host`; storage/schema/postgres.sql). Role names are ours
# (``ci_host_`` + hex), but are still quoted by the server's format(), never by string pasting.
PG_HOSTS_GROUP = "crossintercom_hosts"
PG_ROLE_EXISTS: TextClause = text("SELECT 1 FROM pg_roles WHERE rolname = :role")
PG_CREATE_ROLE: TextClause = text("SELECT format('CREATE ROLE %I LOGIN', CAST(:role AS text))")
PG_ROLE_PASSWORD: TextClause = text(
    "SELECT format('ALTER ROLE %I LOGIN PASSWORD %L', CAST(:role AS text), CAST(:pw AS text))"
)
PG_GRANT_GROUP: TextClause = text(
    f"SELECT format('GRANT {PG_HOSTS_GROUP} TO %I', CAST(:role AS text))"
)
PG_CURRENT_DATABASE: TextClause = text("SELECT current_database()")
# Whether the connected role may change the database's own privileges (its owner, a member of
# the owner's role, or a superuser).
PG_OWNS_DATABASE: TextClause = text(
    """SELECT pg_has_role(current_user, d.datdba, 'MEMBER')
              OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
       FROM pg_database AS d WHERE d.datname = current_database()"""
)
# No temporary objects and no connection for roles the admin did not name (docs/operations.md,
# "Per-host roles on PostgreSQL"); each host role gets CONNECT of its own.
PG_LOCK_DATABASE: TextClause = text(
    "SELECT format('REVOKE TEMPORARY, CONNECT ON DATABASE %I FROM PUBLIC', current_database())"
)
# The host roles of this store that exist (each keeps CONNECT when PUBLIC loses it).
PG_MAPPED_ROLES: TextClause = text(
    "SELECT r.role_name FROM host_roles AS r JOIN pg_roles AS p ON p.rolname = r.role_name"
)
PG_GRANT_CONNECT: TextClause = text(
    "SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), CAST(:role AS text))"
)

# A host id has one role and a role one host id: the old mapping of either goes first.
FORGET_HOST_ROLE: Delete = delete(host_roles).where(
    (host_roles.c.host_id == bindparam("host_id")) | (host_roles.c.role_name == bindparam("role"))
)
INSERT_HOST_ROLE = host_roles.insert().values(
    role_name=bindparam("role"), host_id=bindparam("host_id")
)


def pg_listen(channel: str) -> str:
    # LISTEN takes an identifier, not a parameter; channel names are hex we built ourselves.
    return f'LISTEN "{channel}"'


# --- the archive (docs/archive.md) ----------------------------------------------------------------
# Written by relays in batches on a connection of their own, read by `search` and the overseer
# page. None of these runs on a delivery's path.

READ_ARCHIVE_SETTINGS = select(archive_settings.c.enabled, archive_settings.c.retention_s).where(
    archive_settings.c.id == 1
)


@cache
def upsert_archive_settings(dialect: str) -> Any:
    """Params: enabled, retention_s (the single row, made on first use)."""
    stmt = _insert(dialect, archive_settings).values(
        id=1, enabled=bindparam("enabled"), retention_s=bindparam("retention_s")
    )
    return stmt.on_conflict_do_update(
        index_elements=[archive_settings.c.id],
        set_={"enabled": stmt.excluded.enabled, "retention_s": stmt.excluded.retention_s},
    )


@cache
def archive_messages_if_absent(dialect: str) -> Any:
    """Run with a list of rows. The sender's host and each recipient's host copy the same
    message: the first copy stays, so the text (and its full-text entry) is stored once."""
    return _insert(dialect, archive_messages).on_conflict_do_nothing(
        index_elements=[archive_messages.c.message_id]
    )


@cache
def archive_messages_with_wait(dialect: str) -> Any:
    """Run with a list of rows: an ask's copy from its sender's host, whose payload holds the
    ask's wait (``wait_s``), replaces the payload of a copy a recipient's host wrote first.
    Subject and body are the same message's, so the full-text entry stays right; only a copy
    naming the same sender's host replaces one."""
    stmt = _insert(dialect, archive_messages)
    return stmt.on_conflict_do_update(
        index_elements=[archive_messages.c.message_id],
        set_={"payload": stmt.excluded.payload},
        where=archive_messages.c.sender_host == stmt.excluded.sender_host,
    )


def _rank(outcome: Any) -> Any:
    """models.PROGRESS in SQL: how far along ``outcome`` is (a word that is no outcome: 0)."""
    return case({str(k): v for k, v in PROGRESS.items()}, value=outcome, else_=0)


@cache
def archive_recipients_upsert(dialect: str) -> Any:
    """Run with a list of rows. A recipient's outcome only moves further along (``models.PROGRESS``:
    queued, delivered, shown, acknowledged; failures final): a copy that arrives late, such as
    the sender's host's ``queued`` after the recipient's host's ``delivered``, changes nothing."""
    stmt = _insert(dialect, archive_recipients)
    r = archive_recipients.c
    further = _rank(stmt.excluded.outcome) > _rank(r.outcome)
    return stmt.on_conflict_do_update(
        index_elements=[r.message_id, r.session_id],
        set_={
            "outcome": case((further, stmt.excluded.outcome), else_=r.outcome),
            "code": case((further, stmt.excluded.code), else_=r.code),
            "name": func.coalesce(stmt.excluded.name, r.name),
        },
        # Every writer names the recipient's own host: a copy naming another moves nothing.
        where=r.host_id == stmt.excluded.host_id,
    )


# Run with a list of rows (mid, sid, host, new_outcome, new_code): a later receipt from the
# recipient's host. It moves only a row of a recipient on ``host`` (the writing relay's own
# host) and only further along; a message not archived stays absent.
ARCHIVE_RECEIPT_UPDATE = (
    update(archive_recipients)
    .where(
        archive_recipients.c.message_id == bindparam("mid"),
        archive_recipients.c.session_id == bindparam("sid"),
        archive_recipients.c.host_id == bindparam("host"),
        _rank(archive_recipients.c.outcome) < _rank(bindparam("new_outcome")),
    )
    .values(outcome=bindparam("new_outcome"), code=bindparam("new_code"))
)


# An archive batch runs on the relay's one statement connection: behind a lock it gives up
# within ARCHIVE_LOCK_TIMEOUT_MS, and slow within 2 s, instead of holding deliveries behind it;
# its copies are dropped and logged (docs/archive.md).
ARCHIVE_LOCK_TIMEOUT_MS = 100
PG_ARCHIVE_STATEMENT_TIMEOUT = text(
    "SELECT set_config('statement_timeout', '2s', true), "
    f"set_config('lock_timeout', '{ARCHIVE_LOCK_TIMEOUT_MS}ms', true)"
)

_ARCHIVED = (archive_messages.c.seq, archive_messages.c.payload)

# Params: after, limit. The feed re-reads a window below its cursor (the web page dedups by
# id), since sequence values commit out of order.
ARCHIVE_FEED = (
    select(*_ARCHIVED)
    .where(archive_messages.c.seq > bindparam("after"))
    .order_by(archive_messages.c.seq)
    .limit(bindparam("limit"))
)

# Params: thread_id, limit.
ARCHIVE_THREAD = (
    select(*_ARCHIVED)
    .where(archive_messages.c.thread_id == bindparam("thread_id"))
    .order_by(archive_messages.c.seq)
    .limit(bindparam("limit"))
)

# Params: limit. Threads, latest activity first; the subject is the root's (the earliest set).
ARCHIVE_THREADS = (
    select(
        archive_messages.c.thread_id,
        func.min(archive_messages.c.subject),
        func.count(),
        func.max(archive_messages.c.seq).label("last_seq"),
    )
    .group_by(archive_messages.c.thread_id)
    .order_by(literal_column("last_seq").desc())
    .limit(bindparam("limit"))
)

# Params: message_ids (expanding).
ARCHIVE_RECIPIENTS_OF = select(
    archive_recipients.c.message_id,
    archive_recipients.c.session_id,
    archive_recipients.c.host_id,
    archive_recipients.c.outcome,
    archive_recipients.c.name,
    archive_recipients.c.code,
).where(archive_recipients.c.message_id.in_(bindparam("message_ids", expanding=True)))

# Messages between each pair of hosts: the overseer page's picture.
ARCHIVE_FLOW = (
    select(archive_messages.c.sender_host, archive_recipients.c.host_id, func.count())
    .select_from(
        archive_messages.join(
            archive_recipients,
            archive_recipients.c.message_id == archive_messages.c.message_id,
        )
    )
    .group_by(archive_messages.c.sender_host, archive_recipients.c.host_id)
)

# Params: cutoff, limit. Retention is by the time a message was archived (every host's clock
# is its own; an archived_at is at least one writer's view of "now").
ARCHIVE_EXPIRED_IDS = (
    select(archive_messages.c.message_id)
    .where(archive_messages.c.archived_at < bindparam("cutoff"))
    .limit(bindparam("limit"))
)
ARCHIVE_DELETE_MESSAGES = delete(archive_messages).where(
    archive_messages.c.message_id.in_(bindparam("message_ids", expanding=True))
)
ARCHIVE_DELETE_RECIPIENTS = delete(archive_recipients).where(
    archive_recipients.c.message_id.in_(bindparam("message_ids", expanding=True))
)

# The PostgreSQL document, written exactly as the GIN index of storage/schema/postgres.sql is,
# so the planner uses the index; the text-search configuration is a constant, never a
# parameter, for the same reason.
_PG_DOCUMENT: ColumnClause[Any] = literal_column(
    f"to_tsvector('{TS_CONFIG}'::regconfig, "
    "coalesce(archive_messages.subject, '') || ' ' || archive_messages.body)"
)
_PG_CONFIG: ColumnClause[Any] = literal_column(f"'{TS_CONFIG}'::regconfig")
_PG_HEADLINE_OPTIONS = (
    f"StartSel={MARK_START}, StopSel={MARK_END}, MaxWords=24, MinWords=8, MaxFragments=2, "
    'FragmentDelimiter=" \u2026 "'
)
_FTS = table(ARCHIVE_FTS_TABLE, column("rowid"))


def _search_filters(query: SearchQuery) -> tuple[list[Any], dict[str, Any]]:
    """The WHERE terms both dialects share, and their parameters."""
    m, r = archive_messages.c, archive_recipients.c
    terms: list[Any] = []
    params: dict[str, Any] = {}
    if query.sender is not None:
        terms.append(
            or_(
                m.sender_name == bindparam("sender"),
                m.sender_id == bindparam("sender"),
                (func.coalesce(m.sender_name, m.sender_id) + "@" + m.sender_host)
                == bindparam("sender"),
            )
        )
        params["sender"] = query.sender
    if query.recipient is not None:
        named = exists().where(
            r.message_id == m.message_id,
            or_(
                r.name == bindparam("recipient"),
                r.session_id == bindparam("recipient"),
                (func.coalesce(r.name, r.session_id) + "@" + r.host_id) == bindparam("recipient"),
            ),
        )
        terms.append(or_(m.target == bindparam("recipient"), named))
        params["recipient"] = query.recipient
    if query.host is not None:
        seen = exists().where(r.message_id == m.message_id, r.host_id == bindparam("host"))
        terms.append(or_(m.sender_host == bindparam("host"), seen))
        params["host"] = query.host
    if query.thread is not None:
        terms.append(m.thread_id == bindparam("thread"))
        params["thread"] = query.thread
    if query.since is not None:
        terms.append(m.sent_at >= bindparam("since", type_=DateTime(timezone=True)))
        params["since"] = query.since
    return terms, params


def archive_search(dialect: str, query: SearchQuery) -> tuple[Select[Any], dict[str, Any]]:
    """Ranked full-text search with snippets: PostgreSQL ``websearch_to_tsquery`` over the GIN
    index, SQLite FTS5 ``MATCH`` with ``bm25``. Columns: seq, payload, score (higher is
    better), snippet. The words come from ``search_terms`` (letters and digits only), so
    neither engine ever parses user syntax, and every value is a bound parameter."""
    terms, params = _search_filters(query)
    words = search_terms(query.text)
    params["limit"] = query.limit
    if dialect == "postgresql":
        tsquery = func.websearch_to_tsquery(_PG_CONFIG, bindparam("q"))
        params["q"] = " ".join(words)
        stmt = select(
            *_ARCHIVED,
            func.ts_rank(_PG_DOCUMENT, tsquery).label("score"),
            func.ts_headline(
                _PG_CONFIG,
                func.coalesce(archive_messages.c.subject, "")
                + " \u2014 "
                + archive_messages.c.body,
                tsquery,
                _PG_HEADLINE_OPTIONS,
            ),
        ).where(_PG_DOCUMENT.op("@@")(tsquery), *terms)
        order = [literal_column("score").desc(), archive_messages.c.seq.desc()]
    else:
        fts: ColumnClause[Any] = literal_column(ARCHIVE_FTS_TABLE)
        # Each word a quoted FTS5 string (implicit AND); a quote cannot occur in a \w word.
        params["match"] = " ".join(f'"{w}"' for w in words)
        stmt = (
            select(
                *_ARCHIVED,
                (-func.bm25(fts, 2.0, 1.0)).label("score"),
                func.snippet(fts, -1, MARK_START, MARK_END, "\u2026", 20),
            )
            .select_from(_FTS.join(archive_messages, archive_messages.c.seq == _FTS.c.rowid))
            .where(fts.op("MATCH")(bindparam("match")), *terms)
        )
        order = [literal_column("score").desc(), archive_messages.c.seq.desc()]
    return stmt.order_by(*order).limit(bindparam("limit")), params


# -- rows a rogue writes (the chaos run's hostile-row fault) ------------------------------------

# Straight into the tables, past every check a relay makes on its way out. Params: the columns.
ROGUE_INSERT_MESSAGE = messages.insert()
ROGUE_INSERT_DELIVERY = deliveries.insert()

# Params: message_ids (a list).
DELIVERY_REASONS: Select[str, DeliveryState, str | None] = select(
    deliveries.c.message_id, deliveries.c.state, deliveries.c.reason
).where(deliveries.c.message_id.in_(bindparam("message_ids", expanding=True)))


# -- whether the store's locks are free (the chaos run's takeover fault) ----------------------

# A relay frozen inside a transaction holds its host's row (and, on SQLite, the whole file)
# until it runs again: the takeover fault freezes a relay only while it holds none.
SQLITE_BEGIN_EXCLUSIVE = "BEGIN EXCLUSIVE"
SQLITE_ROLLBACK = "ROLLBACK"
# How long a lock may be waited for in this transaction. Params: ms (text).
PG_SET_LOCK_TIMEOUT: TextClause = text("SELECT set_config('lock_timeout', :ms, true)")
# The SQLSTATE of a statement that waited out that time.
PG_LOCK_NOT_AVAILABLE = "55P03"
# Params: host_id.
LOCK_HOST_ROW: Select[int] = (
    select(hosts.c.generation).where(hosts.c.host_id == bindparam("host_id")).with_for_update()
)


# -- sessions holding up the store (PostgreSQL; `status` and the relay's log name them) ---------

# Other sessions of this database that hold up writers: idle in a transaction for over
# :idle_s seconds with locks on the store's tables, holding a table lock no relay's statement
# takes (LOCK TABLE, a migration's DDL), or holding the migration lock. pg_locks shows every
# session's locks to every role; pg_stat_activity hides the state, times and client address of
# other roles' sessions without pg_read_all_stats (docs/operations.md): those come back NULL,
# so under a per-host role a table or migration lock is still named (pid, role, application),
# an idle transaction's row locks are not. Params: idle_s (float), tables (a list), key.
PG_STUCK_TRANSACTIONS: TextClause = text(
    """
    WITH held AS (
        SELECT l.pid,
               CASE WHEN l.locktype = 'advisory' THEN :migration ELSE c.relname::text END
                   AS what,
               l.locktype = 'relation' AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock',
                   'ExclusiveLock', 'AccessExclusiveLock') AS strong
        FROM pg_locks l
        LEFT JOIN pg_class c ON c.oid = l.relation AND l.locktype = 'relation'
        WHERE l.granted AND l.pid <> pg_backend_pid()
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND ((l.locktype = 'relation' AND c.relname = ANY(:tables))
               OR (l.locktype = 'advisory' AND l.classid = 0 AND l.objsubid = 1
                   AND l.objid = CAST(:key AS oid)))
    )
    SELECT a.pid, a.usename, a.application_name, host(a.client_addr),
           EXTRACT(EPOCH FROM now() - CASE WHEN bool_or(h.strong OR h.what = :migration)
                                           THEN a.xact_start ELSE a.state_change END)::float8,
           array_agg(DISTINCT h.what ORDER BY h.what),
           CASE WHEN bool_or(h.strong OR h.what = :migration) THEN 'lock' ELSE 'idle' END
    FROM held h
    JOIN pg_stat_activity a ON a.pid = h.pid
    GROUP BY a.pid, a.usename, a.application_name, a.client_addr, a.state_change, a.xact_start,
             a.state
    HAVING bool_or(h.strong OR h.what = :migration)
        OR (a.state IN ('idle in transaction', 'idle in transaction (aborted)')
            AND a.state_change < now() - make_interval(secs => :idle_s))
    ORDER BY a.pid
    """
)


# What an acknowledgement is worth on this server (storage/replication.py): its replication
# settings and standbys. sync_state is NULL in the rows of a role without pg_read_all_stats
# (a per-host role): then the standbys are counted but their mode is not known.
PG_REPLICATION: TextClause = text(
    """
    SELECT pg_is_in_recovery(),
           current_setting('synchronous_standby_names'),
           current_setting('synchronous_commit'),
           (SELECT count(*) FROM pg_stat_replication),
           (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),
           (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL)
    """
)
