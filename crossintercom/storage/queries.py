"""Every statement the store runs, by name, in one place.

Statements are SQLAlchemy Core, built here and executed by the backends. The few that are
dialect-specific (upserts, NOTIFY, advisory locks, ``SKIP LOCKED``) say so in their name or
take the dialect name. Plain Core that one dialect ignores (``FOR UPDATE`` on SQLite, where
``BEGIN IMMEDIATE`` already serialises writers) stays shared.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Delete,
    Insert,
    Select,
    TextClause,
    Update,
    bindparam,
    delete,
    exists,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import ReturningInsert, ReturningUpdate

from crossintercom.storage.tables import deliveries, hosts, messages, receipts, roster, settings


def _insert(dialect: str, table: Any) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT."""
    return postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table)


# -- hosts, fencing, liveness ---------------------------------------------------------------


def claim_host(dialect: str, host_id: str) -> ReturningInsert[int]:
    """generation := generation + 1, creating the host row on first start."""
    stmt = _insert(dialect, hosts).values(host_id=host_id, generation=1, heartbeat=0)
    stmt = stmt.on_conflict_do_update(
        index_elements=[hosts.c.host_id],
        set_={"generation": hosts.c.generation + 1},
    )
    returning: ReturningInsert[int] = stmt.returning(hosts.c.generation)
    return returning


def heartbeat(host_id: str, generation: int) -> Update:
    return (
        update(hosts)
        .where(hosts.c.host_id == host_id, hosts.c.generation == generation)
        .values(heartbeat=hosts.c.heartbeat + 1)
    )


def list_hosts() -> Select[str, int, int]:
    return select(hosts.c.host_id, hosts.c.generation, hosts.c.heartbeat).order_by(hosts.c.host_id)


def current_generation(host_id: str) -> Select[int]:
    """Read under a share lock, so a concurrent ``claim_host`` waits until this write ends:
    a write conditioned on generation g is never committed after g + 1 was handed out."""
    return select(hosts.c.generation).where(hosts.c.host_id == host_id).with_for_update(read=True)


# -- roster --------------------------------------------------------------------------------


def delete_roster(host_id: str) -> Delete:
    return delete(roster).where(roster.c.host_id == host_id)


def insert_roster() -> Insert:
    return roster.insert()


def list_roster() -> Select[Any]:
    return select(roster).order_by(roster.c.host_id, roster.c.session_id)


# -- messages and deliveries -----------------------------------------------------------------


def insert_message_if_absent(dialect: str) -> Any:
    return _insert(dialect, messages).on_conflict_do_nothing(index_elements=[messages.c.message_id])


def insert_delivery_if_absent(dialect: str) -> Any:
    """Returns the new seq, or no row when the (message, recipient) pair already existed."""
    return (
        _insert(dialect, deliveries)
        .on_conflict_do_nothing(
            index_elements=[deliveries.c.message_id, deliveries.c.recipient_session]
        )
        .returning(deliveries.c.seq)
    )


def message_digest(message_id: str) -> Select[str]:
    return select(messages.c.digest).where(messages.c.message_id == message_id)


def delivery_state(message_id: str, recipient_session: str) -> Select[str]:
    return select(deliveries.c.state).where(
        deliveries.c.message_id == message_id,
        deliveries.c.recipient_session == recipient_session,
    )


def message_states(message_id: str) -> Select[str, str]:
    return select(deliveries.c.recipient_session, deliveries.c.state).where(
        deliveries.c.message_id == message_id
    )


def inbound(
    host_id: str,
    generation: int,
    limit: int,
    session_ids: Collection[str] | None,
    *,
    skip_locked: bool,
) -> Select[int, str, str, Any, str]:
    """Queued rows for one host, by state and in seq order, only for its current generation.

    Never ``seq > cursor``: sequences commit out of order, so a cursor would skip late commits.
    """
    current = exists().where(hosts.c.host_id == host_id, hosts.c.generation == generation)
    stmt = (
        select(
            deliveries.c.seq,
            deliveries.c.message_id,
            deliveries.c.recipient_session,
            messages.c.payload,
            messages.c.sender_host,
        )
        .join(messages, messages.c.message_id == deliveries.c.message_id)
        .where(deliveries.c.recipient_host == host_id, deliveries.c.state == "queued", current)
        .order_by(deliveries.c.seq)
        .limit(limit)
    )
    if session_ids is not None:
        stmt = stmt.where(deliveries.c.recipient_session.in_(list(session_ids)))
    if skip_locked:
        # Rows an ack or expiry is changing right now are skipped, not waited for.
        stmt = stmt.with_for_update(skip_locked=True, of=deliveries)
    return stmt


def finish_delivery(
    host_id: str,
    ack_message_id: str,
    recipient_session: str,
    state: str,
    reason: str | None,
    now: datetime,
) -> Update:
    """queued → delivered/refused; matches nothing when already finished (idempotent ack)."""
    return (
        update(deliveries)
        .where(
            deliveries.c.message_id == ack_message_id,
            deliveries.c.recipient_session == recipient_session,
            deliveries.c.recipient_host == host_id,
            deliveries.c.state == "queued",
        )
        .values(state=state, reason=reason, finished_at=now)
    )


def message_senders(message_ids: Collection[str]) -> Select[str, str]:
    return select(messages.c.message_id, messages.c.sender_host).where(
        messages.c.message_id.in_(list(message_ids))
    )


def insert_receipt() -> Insert:
    return receipts.insert()


def list_receipts(host_id: str, limit: int) -> Select[int, str, str, str, str, str | None]:
    return (
        select(
            receipts.c.id,
            receipts.c.message_id,
            receipts.c.recipient_session,
            receipts.c.recipient_host,
            receipts.c.outcome,
            receipts.c.code,
        )
        .where(receipts.c.sender_host == host_id)
        .order_by(receipts.c.id)
        .limit(limit)
    )


def delete_receipts(host_id: str, receipt_ids: Sequence[int]) -> Delete:
    return delete(receipts).where(receipts.c.sender_host == host_id, receipts.c.id.in_(receipt_ids))


def expire_batch(now: datetime, limit: int) -> ReturningUpdate[int, str, str, str]:
    due = (
        select(deliveries.c.seq)
        .where(deliveries.c.state == "queued", deliveries.c.expires_at < now)
        .order_by(deliveries.c.seq)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return (
        update(deliveries)
        .where(deliveries.c.seq.in_(due.scalar_subquery()), deliveries.c.state == "queued")
        .values(state="expired", reason="expired", finished_at=now)
        .returning(
            deliveries.c.seq,
            deliveries.c.message_id,
            deliveries.c.recipient_session,
            deliveries.c.recipient_host,
        )
    )


# -- purge ---------------------------------------------------------------------------------


def purge_deliveries(cutoff: datetime, limit: int) -> Any:
    done = (
        select(deliveries.c.seq)
        .where(deliveries.c.state != "queued", deliveries.c.finished_at < cutoff)
        .limit(limit)
    )
    return (
        delete(deliveries)
        .where(deliveries.c.seq.in_(done.scalar_subquery()))
        .returning(deliveries.c.message_id)
    )


def purge_orphan_messages(message_ids: Collection[str]) -> Delete:
    """Drop messages among ``message_ids`` that no delivery row refers to any more."""
    return delete(messages).where(
        messages.c.message_id.in_(list(message_ids)),
        ~exists().where(deliveries.c.message_id == messages.c.message_id),
    )


def purge_receipts(cutoff: datetime, limit: int) -> Delete:
    """Receipts nobody consumed (their host is gone) go after the retention period."""
    old = select(receipts.c.id).where(receipts.c.created < cutoff).limit(limit)
    return delete(receipts).where(receipts.c.id.in_(old.scalar_subquery()))


# -- settings and schema -------------------------------------------------------------------


def read_settings() -> Select[int, int]:
    return select(settings.c.max_message_bytes, settings.c.retention_s).where(settings.c.id == 1)


def update_settings(values: dict[str, int]) -> Update:
    return update(settings).where(settings.c.id == 1).values(**values)


SCHEMA_VERSION = text("SELECT version_num FROM alembic_version")

# -- PostgreSQL only -------------------------------------------------------------------------

PG_NOTIFY: TextClause = text("SELECT pg_notify(:channel, '')").bindparams(
    bindparam("channel", type_=None)
)
PG_HEALTH = "SELECT 1"
# Serialises concurrent `db upgrade` runs; the key is arbitrary but fixed forever.
PG_MIGRATION_LOCK_KEY = 0x63690001
PG_ADVISORY_LOCK = text("SELECT pg_advisory_lock(:key)")
PG_ADVISORY_UNLOCK = text("SELECT pg_advisory_unlock(:key)")


def pg_listen(channel: str) -> str:
    # LISTEN takes an identifier, not a parameter; channel names are hex we built ourselves.
    return f'LISTEN "{channel}"'
