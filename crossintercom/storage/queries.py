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
    DateTime,
    Delete,
    Select,
    Text,
    TextClause,
    Update,
    bindparam,
    delete,
    exists,
    func,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from crossintercom.storage.interface import DeliveryState, ReceiptOutcome
from crossintercom.storage.tables import deliveries, hosts, messages, receipts, roster, settings

# Statements are built once, with bound parameters, and reused: building and hashing a Core
# statement per call cost more than the round trip of a one-row statement. The functions that
# take a dialect or a shape are cached per argument for the same reason.


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

# Recorded with the claim, in its transaction. Params: host, gen, machine.
SET_HOST_MACHINE: Update = (
    update(hosts)
    .where(hosts.c.host_id == bindparam("host"), hosts.c.generation == bindparam("gen"))
    .values(machine=bindparam("machine"))
)

LIST_HOSTS: Select[str, int, int] = select(
    hosts.c.host_id, hosts.c.generation, hosts.c.heartbeat
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
INSERT_ROSTER = roster.insert()
LIST_ROSTER: Select[Any] = select(roster).order_by(roster.c.host_id, roster.c.session_id)


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


@cache
def inbound(*, by_session: bool, skip_locked: bool) -> Select[int, str, str, Any, str]:
    """Queued rows for one host, by state and in seq order, only for its current generation.

    Params: host_id, generation, limit, and session_ids (a list) when ``by_session``. Never
    ``seq > cursor``: sequences commit out of order, so a cursor would skip late commits.
    """
    stmt = (
        select(
            deliveries.c.seq,
            deliveries.c.message_id,
            deliveries.c.recipient_session,
            messages.c.payload,
            messages.c.sender_host,
        )
        .join(messages, messages.c.message_id == deliveries.c.message_id)
        .where(
            deliveries.c.recipient_host == bindparam("host_id"),
            deliveries.c.state == "queued",
            _current(),
        )
        .order_by(deliveries.c.seq)
        .limit(bindparam("limit"))
    )
    if by_session:
        stmt = stmt.where(
            deliveries.c.recipient_session.in_(bindparam("session_ids", expanding=True))
        )
    if skip_locked:
        # Rows an ack or expiry is changing right now are skipped, not waited for.
        stmt = stmt.with_for_update(skip_locked=True, of=deliveries)
    return stmt


# queued → delivered/refused for a list of (message_id, recipient_session) keys that share one
# outcome; matches nothing for a row already finished (idempotent ack). Returns the keys it
# changed. Params: host_id, new_state, new_reason, finished and ``key_params``.
@cache
def finish_deliveries(dialect: str) -> Any:
    return (
        update(deliveries)
        .where(
            _in_keys(dialect),
            deliveries.c.recipient_host == bindparam("host_id"),
            deliveries.c.state == "queued",
        )
        .values(
            state=bindparam("new_state"),
            reason=bindparam("new_reason"),
            finished_at=bindparam("finished"),
        )
        .returning(deliveries.c.message_id, deliveries.c.recipient_session)
    )


# One receipt per finished delivery among ``keys``, for the sender's host, in seq order: the
# outcome is the delivery's new state and the code its reason. Returns the sender hosts (to
# wake). Params: created and ``key_params``.
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
            .where(_in_keys(dialect))
            .order_by(deliveries.c.seq),
        )
        .returning(receipts.c.sender_host)
    )


# Params: host_id, generation, limit. Fenced in the statement itself: nothing for a stale
# generation.
LIST_RECEIPTS: Select[int, str, str, str, ReceiptOutcome, str | None, str | None] = (
    select(
        receipts.c.id,
        receipts.c.message_id,
        receipts.c.recipient_session,
        receipts.c.recipient_host,
        receipts.c.outcome,
        receipts.c.code,
        receipts.c.sender_session,
    )
    .where(receipts.c.sender_host == bindparam("host_id"), _current())
    .order_by(receipts.c.id)
    .limit(bindparam("limit"))
)

# Receipts a recipient's host writes after its ack (``shown``, a late ``expired``), run with a
# list of rows. The writer is always the recipient's host (``recipient_host``); the caller
# checks its generation in the same transaction.
INSERT_LATE_RECEIPTS = receipts.insert()

# `forget`: what is still queued for one session of the host expires now, with the code
# ``forgotten``. Returns the keys it changed (their receipts are written next). Params:
# host_id, session_id, finished.
FORGET_DELIVERIES = (
    update(deliveries)
    .where(
        deliveries.c.recipient_host == bindparam("host_id"),
        deliveries.c.recipient_session == bindparam("session_id"),
        deliveries.c.state == "queued",
    )
    .values(state="expired", reason="forgotten", finished_at=bindparam("finished"))
    .returning(deliveries.c.message_id, deliveries.c.recipient_session)
)

# Params: host_id, receipt_ids (a list).
DELETE_RECEIPTS: Delete = delete(receipts).where(
    receipts.c.sender_host == bindparam("host_id"),
    receipts.c.id.in_(bindparam("receipt_ids", expanding=True)),
)


def _expire_batch() -> Update:
    due = (
        select(deliveries.c.seq)
        .where(deliveries.c.state == "queued", deliveries.c.expires_at < bindparam("now"))
        .order_by(deliveries.c.seq)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
    )
    return (
        update(deliveries)
        .where(deliveries.c.seq.in_(due.scalar_subquery()), deliveries.c.state == "queued")
        .values(state="expired", reason="expired", finished_at=bindparam("finished"))
    )


# Params: now, finished (the same time), limit. Returns the keys it expired.
EXPIRE_BATCH = _expire_batch().returning(deliveries.c.message_id, deliveries.c.recipient_session)


# -- purge ---------------------------------------------------------------------------------

# Params: cutoff, limit.
PURGE_DELIVERIES = (
    delete(deliveries)
    .where(
        deliveries.c.seq.in_(
            select(deliveries.c.seq)
            .where(deliveries.c.state != "queued", deliveries.c.finished_at < bindparam("cutoff"))
            .limit(bindparam("limit"))
            .scalar_subquery()
        )
    )
    .returning(deliveries.c.message_id)
)

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


def update_settings(values: dict[str, int]) -> Update:
    return update(settings).where(settings.c.id == 1).values(**values)


SCHEMA_VERSION = text("SELECT version_num FROM alembic_version")

# -- PostgreSQL only -------------------------------------------------------------------------

# One statement wakes every host of a transaction; sent at commit, once per channel.
# Params: channels (a list).
PG_NOTIFY: TextClause = text(
    "SELECT pg_notify(channel, '') FROM unnest(CAST(:channels AS text[])) AS channel"
)
PG_HEALTH = "SELECT 1"
# Serialises concurrent `db upgrade` runs; the key is arbitrary but fixed forever.
PG_MIGRATION_LOCK_KEY = 0x63690001
PG_ADVISORY_LOCK = text("SELECT pg_advisory_lock(:key)")
PG_ADVISORY_UNLOCK = text("SELECT pg_advisory_unlock(:key)")


def pg_listen(channel: str) -> str:
    # LISTEN takes an identifier, not a parameter; channel names are hex we built ourselves.
    return f'LISTEN "{channel}"'
