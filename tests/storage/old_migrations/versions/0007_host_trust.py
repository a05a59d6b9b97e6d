"""per-host roles that hold: unshadowable policy functions, column rights, one owner per session
id, receipts only from a recipient's host, no reach into another store

- Every SECURITY DEFINER function names each object by schema and runs with
  ``search_path = pg_catalog, public, pg_temp`` (a caller's temporary table, view or function
  can no longer stand in for ``host_roles``, ``messages`` or ``deliveries``); operators are
  spelt ``OPERATOR(pg_catalog.=)``.
- Host roles may UPDATE only the columns the relay's statements change (docs/operations.md,
  "Trust model"): ``hosts`` generation, heartbeat, machine, roster_rev; ``deliveries`` state,
  reason, finished_at; nothing of ``roster``, ``messages`` or ``receipts``.
- A session id belongs to one host: a unique index on ``roster.session_id`` (both dialects);
  rows whose id has a durable id's shape (a version 5 UUID) but does not derive from their host
  and name, and ids claimed twice, are dropped first (never by order: every claim of a doubled
  id goes; models.rightful_claims is the same rule for receivers).
- A receipt is written by its recipient's host only for a delivery to it of that message, or by
  the sender's host about its own message; outcomes and codes come from the known lists.
- Every policy needs the role mapped in this store's ``host_roles``: a role of another store
  on the same server reads no row here, not even the roster's.
- ``crossintercom_private_hints()``: true once any host role exists; wake-ups then carry no
  rows (queries._PG_RECEIPT_HINTS).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GROUP = "crossintercom_hosts"
TABLES = ("hosts", "roster", "messages", "deliveries", "receipts")

# Frozen with this revision: every errors.Code value of its time, and the ``queued`` detail of
# a delivered ack. A code added later needs a migration that widens these lists
# (tests/storage/test_host_roles_attack.py checks that none is missing).
CODES = (
    "bad_utf8", "bad_json", "not_object", "missing_field", "bad_field", "unknown_type",
    "frame_too_large", "not_registered", "already_registered", "protocol_mismatch",
    "invalid_purpose", "session_in_use", "relay_in_use", "not_agent", "not_relay",
    "peer_not_allowed", "unexpected_ack", "internal", "not_found", "ambiguous",
    "missing_target", "group_ask", "bad_attachment", "too_large", "payload_conflict",
    "over_capacity", "reply_not_authorised", "already_replied", "asker_gone", "bad_message",
    "forged_sender", "undeliverable", "id_conflict", "refused", "expired", "rate_limited",
    "crossing_ask", "forgotten", "no_relay", "recipient_gone", "local_storage", "save_failed",
    "store_unavailable", "store_in_doubt", "broker_unavailable", "disconnected", "relay_lost",
    "no_ack", "uncertain", "deadline", "queued_at_host", "inbox_unavailable", "not_one_line",
    "queued",
)  # fmt: skip
OUTCOMES = ("delivered", "refused", "expired", "shown")
STATES = ("queued", "delivered", "refused", "expired")
# The UPDATE rights of a host role, column by column (every other column is read-only to it).
UPDATABLE = {
    "hosts": ("generation", "heartbeat", "machine", "roster_rev"),
    "deliveries": ("state", "reason", "finished_at"),
}
# The durable session id namespace (models.SESSION_NAMESPACE), frozen here.
SESSION_NAMESPACE = uuid.UUID("6f1c2a4e-8d0b-5b7e-9a53-3c1d2e4f5a60")

_EQ = "OPERATOR(pg_catalog.=)"
_DEFINER = "LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp"
FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION public.crossintercom_host() RETURNS text {_DEFINER} AS
    $$ SELECT r.host_id::text FROM public.host_roles AS r
       WHERE r.role_name::text {_EQ} session_user::text $$;
CREATE OR REPLACE FUNCTION public.crossintercom_sender(mid text) RETURNS text {_DEFINER} AS
    $$ SELECT m.sender_host::text FROM public.messages AS m
       WHERE m.message_id::text {_EQ} mid $$;
CREATE OR REPLACE FUNCTION public.crossintercom_addressed(mid text) RETURNS boolean {_DEFINER} AS
    $$ SELECT EXISTS (SELECT 1 FROM public.deliveries AS d
                      WHERE d.message_id::text {_EQ} mid
                        AND d.recipient_host::text {_EQ} public.crossintercom_host()) $$;
CREATE OR REPLACE FUNCTION public.crossintercom_received(mid text, session text,
                                                         sender_session text)
    RETURNS boolean {_DEFINER} AS
    $$ SELECT EXISTS (
           SELECT 1 FROM public.deliveries AS d
           JOIN public.messages AS m ON m.message_id::text {_EQ} d.message_id::text
           WHERE d.message_id::text {_EQ} mid
             AND d.recipient_session::text {_EQ} session
             AND d.recipient_host::text {_EQ} public.crossintercom_host()
             AND (sender_session IS NULL
                  OR (m.payload OPERATOR(pg_catalog.->) 'from')
                     OPERATOR(pg_catalog.->>) 'id' {_EQ} sender_session)) $$;
CREATE OR REPLACE FUNCTION public.crossintercom_private_hints() RETURNS boolean {_DEFINER} AS
    $$ SELECT EXISTS (SELECT 1 FROM public.host_roles) $$;
REVOKE ALL ON FUNCTION public.crossintercom_host(), public.crossintercom_sender(text),
    public.crossintercom_addressed(text), public.crossintercom_received(text, text, text),
    public.crossintercom_private_hints() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.crossintercom_host(), public.crossintercom_sender(text),
    public.crossintercom_addressed(text), public.crossintercom_received(text, text, text)
    TO {GROUP};
GRANT EXECUTE ON FUNCTION public.crossintercom_private_hints() TO PUBLIC;
"""
NEW_FUNCTIONS = (
    "public.crossintercom_received(text, text, text)",
    "public.crossintercom_private_hints()",
)


def _listed(values: Sequence[str]) -> str:
    return "ARRAY[{}]::text[]".format(", ".join(f"'{v}'" for v in values))


ME = "public.crossintercom_host()"
MAPPED = f"{ME} IS NOT NULL"
SENDER = "public.crossintercom_sender(message_id)"
CODE_OK = f"(code IS NULL OR code = ANY({_listed(CODES)}))"
REASON_OK = f"(reason IS NULL OR reason = ANY({_listed(CODES)}))"
MINE = f"recipient_host = {ME} OR {SENDER} = {ME}"
# (table, policy, command, USING, WITH CHECK)
POLICIES: tuple[tuple[str, str, str, str | None, str | None], ...] = (
    # Leases and the roster: read by every host of this store (a role mapped here).
    ("hosts", "hosts_read", "SELECT", MAPPED, None),
    ("hosts", "hosts_claim", "INSERT", None, f"host_id = {ME}"),
    ("hosts", "hosts_bump", "UPDATE", f"host_id = {ME}", f"host_id = {ME}"),
    ("roster", "roster_read", "SELECT", MAPPED, None),
    ("roster", "roster_write", "INSERT", None, f"host_id = {ME}"),
    ("roster", "roster_remove", "DELETE", f"host_id = {ME}", None),
    ("messages", "messages_send", "INSERT", None, f"sender_host = {ME}"),
    (
        "messages",
        "messages_read",
        "SELECT",
        f"sender_host = {ME} OR public.crossintercom_addressed(message_id)",
        None,
    ),
    ("messages", "messages_purge", "DELETE", f"sender_host = {ME}", None),
    (
        "deliveries",
        "deliveries_send",
        "INSERT",
        None,
        f"{SENDER} = {ME} AND state = ANY({_listed(STATES)}) AND {REASON_OK}",
    ),
    ("deliveries", "deliveries_read", "SELECT", MINE, None),
    ("deliveries", "deliveries_finish", "UPDATE", MINE, f"({MINE}) AND {REASON_OK}"),
    ("deliveries", "deliveries_purge", "DELETE", MINE, None),
    (
        "receipts",
        "receipts_write",
        "INSERT",
        None,
        f"outcome = ANY({_listed(OUTCOMES)}) AND {CODE_OK} AND ("
        f"(sender_host = {ME} AND {SENDER} = {ME} AND sender_session IS NULL) OR "
        f"(recipient_host = {ME} AND sender_host = {SENDER} AND "
        "public.crossintercom_received(message_id, recipient_session, sender_session)))",
    ),
    ("receipts", "receipts_read", "SELECT", f"sender_host = {ME} OR recipient_host = {ME}", None),
    (
        "receipts",
        "receipts_consume",
        "DELETE",
        f"sender_host = {ME} OR recipient_host = {ME}",
        None,
    ),
)


def _derived_shape(session_id: str) -> bool:
    try:
        return uuid.UUID(session_id).version == 5
    except ValueError:
        return False


def _durable_id(host_id: str, name: str) -> str:
    return str(uuid.uuid5(SESSION_NAMESPACE, f"{host_id}\x00{name}"))


def _one_owner_per_session() -> None:
    """Drop the roster rows no receiver would keep (models.rightful_claims): rows with a
    durable id's shape that is not their host's and name's, then every row of an id still
    claimed by two hosts."""
    conn = op.get_bind()
    rows = conn.exec_driver_sql("SELECT host_id, session_id, name, durable FROM roster").all()
    bad = [
        (h, s)
        for h, s, name, _durable in rows
        if _derived_shape(s) and (name is None or s != _durable_id(h, name))
    ]
    owners: dict[str, set[str]] = {}
    for h, s, *_ in rows:
        if (h, s) not in bad:
            owners.setdefault(s, set()).add(h)
    bad += [(h, s) for s, hs in owners.items() if len(hs) > 1 for h in hs]
    for h, s in bad:
        conn.exec_driver_sql(
            "DELETE FROM roster WHERE host_id = %s AND session_id = %s"
            if conn.dialect.name == "postgresql"
            else "DELETE FROM roster WHERE host_id = ? AND session_id = ?",
            (h, s),
        )


def _create_policies(policies: Sequence[tuple[str, str, str, str | None, str | None]]) -> None:
    for table, name, command, using, check in policies:
        sql = f"CREATE POLICY {name} ON {table} FOR {command} TO {GROUP}"
        if using is not None:
            sql += f" USING ({using})"
        if check is not None:
            sql += f" WITH CHECK ({check})"
        op.execute(sql)


def _old() -> Any:
    """Revision 0004's module (its policies and functions, to drop and to restore)."""
    spec = importlib.util.spec_from_file_location(
        "crossintercom_migration_0004", Path(__file__).with_name("0004_host_roles.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    _one_owner_per_session()
    op.create_index("uq_roster_session_id", "roster", ["session_id"], unique=True)
    if op.get_bind().dialect.name != "postgresql":
        return
    # One transaction, a few short catalog changes: relays' statements wait on the tables'
    # locks for its duration and go on under the new rules.
    for table, name, *_ in _old().POLICIES:
        op.execute(f"DROP POLICY IF EXISTS {name} ON {table}")
    op.execute(FUNCTIONS)
    for table in TABLES:
        op.execute(f"REVOKE UPDATE ON {table} FROM {GROUP}")
    for table, columns in UPDATABLE.items():
        op.execute(f"GRANT UPDATE ({', '.join(columns)}) ON {table} TO {GROUP}")
    _create_policies(POLICIES)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, name, *_ in POLICIES:
            op.execute(f"DROP POLICY IF EXISTS {name} ON {table}")
        for table, columns in UPDATABLE.items():
            op.execute(f"REVOKE UPDATE ({', '.join(columns)}) ON {table} FROM {GROUP}")
        for table in TABLES:
            op.execute(f"GRANT UPDATE ON {table} TO {GROUP}")
        op.execute(f"DROP FUNCTION IF EXISTS {', '.join(NEW_FUNCTIONS)}")
        op.execute(_old().FUNCTIONS)
        _create_policies(_old().POLICIES)
    op.drop_index("uq_roster_session_id", table_name="roster")
