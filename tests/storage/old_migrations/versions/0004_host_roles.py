"""per-host database roles and row-level security (PostgreSQL; the table on both dialects)

Each host's relay may connect as its own role (``crossintercom db grant-host HOST_ID``), a
member of the NOLOGIN group ``crossintercom_hosts``. ``host_roles`` maps a role to its host id;
the policies below let such a role write messages only as its own host, read only deliveries
addressed to it (and those of its own messages), change only its own claims, acks, leases and
roster rows, and read the roster and the host rows. The admin role that owns the tables (and
runs these migrations) is not subject to them. docs/operations.md gives the trust model.

Revision ID: 0004
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GROUP = "crossintercom_hosts"
TABLES = ("hosts", "roster", "messages", "deliveries", "receipts")

# The host id of the connected role (NULL for any other role; session_user, since inside a
# SECURITY DEFINER function current_user is the owner). SECURITY DEFINER: they run as the
# owner, so the policies can consult host_roles and messages without recursing into their own
# policies.
FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION crossintercom_host() RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS
    $$ SELECT host_id FROM host_roles WHERE role_name = session_user $$;
CREATE OR REPLACE FUNCTION crossintercom_sender(mid text) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS
    $$ SELECT sender_host FROM messages WHERE message_id = mid $$;
CREATE OR REPLACE FUNCTION crossintercom_addressed(mid text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public AS
    $$ SELECT EXISTS (SELECT 1 FROM deliveries
                      WHERE message_id = mid AND recipient_host = crossintercom_host()) $$;
REVOKE ALL ON FUNCTION crossintercom_host(), crossintercom_sender(text),
    crossintercom_addressed(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION crossintercom_host(), crossintercom_sender(text),
    crossintercom_addressed(text) TO {GROUP};
"""

ME = "crossintercom_host()"
# (table, policy, command, USING, WITH CHECK)
POLICIES: tuple[tuple[str, str, str, str | None, str | None], ...] = (
    # Every host observes every lease (liveness) and reads the roster.
    ("hosts", "hosts_read", "SELECT", "true", None),
    ("hosts", "hosts_claim", "INSERT", None, f"host_id = {ME}"),
    ("hosts", "hosts_bump", "UPDATE", f"host_id = {ME}", f"host_id = {ME}"),
    ("roster", "roster_read", "SELECT", "true", None),
    ("roster", "roster_write", "INSERT", None, f"host_id = {ME}"),
    ("roster", "roster_change", "UPDATE", f"host_id = {ME}", f"host_id = {ME}"),
    ("roster", "roster_remove", "DELETE", f"host_id = {ME}", None),
    # Messages: written only as oneself; read when sent by or addressed to oneself.
    ("messages", "messages_send", "INSERT", None, f"sender_host = {ME}"),
    (
        "messages",
        "messages_read",
        "SELECT",
        f"sender_host = {ME} OR crossintercom_addressed(message_id)",
        None,
    ),
    ("messages", "messages_purge", "DELETE", f"sender_host = {ME}", None),
    # Deliveries: made only for one's own messages; read, finished (ack, expiry) and purged by
    # their recipient host or their sender's host.
    ("deliveries", "deliveries_send", "INSERT", None, f"crossintercom_sender(message_id) = {ME}"),
    (
        "deliveries",
        "deliveries_read",
        "SELECT",
        f"recipient_host = {ME} OR crossintercom_sender(message_id) = {ME}",
        None,
    ),
    (
        "deliveries",
        "deliveries_finish",
        "UPDATE",
        f"recipient_host = {ME} OR crossintercom_sender(message_id) = {ME}",
        f"recipient_host = {ME} OR crossintercom_sender(message_id) = {ME}",
    ),
    (
        "deliveries",
        "deliveries_purge",
        "DELETE",
        f"recipient_host = {ME} OR crossintercom_sender(message_id) = {ME}",
        None,
    ),
    # Receipts: written by the delivery's recipient host (ack) or its sender's (expiry), read
    # and consumed by the sender's host.
    ("receipts", "receipts_write", "INSERT", None, f"recipient_host = {ME} OR sender_host = {ME}"),
    ("receipts", "receipts_read", "SELECT", f"sender_host = {ME} OR recipient_host = {ME}", None),
    (
        "receipts",
        "receipts_consume",
        "DELETE",
        f"sender_host = {ME} OR recipient_host = {ME}",
        None,
    ),
)


def upgrade() -> None:
    op.create_table(
        "host_roles",
        sa.Column("role_name", sa.String(63), nullable=False),
        sa.Column("host_id", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("role_name", name="pk_host_roles"),
        sa.UniqueConstraint("host_id", name="uq_host_roles_host_id"),
    )
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite: the file's permissions are the trust boundary
    # Roles are cluster-wide: another database of the same server may have made it already.
    op.execute(
        f"""DO $$ BEGIN
            IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{GROUP}') THEN
                CREATE ROLE {GROUP} NOLOGIN;
            END IF;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
        END $$"""
    )
    op.execute(FUNCTIONS)
    for table in TABLES:
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {GROUP}")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute(f"GRANT SELECT ON settings, alembic_version TO {GROUP}")
    op.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {GROUP}")
    for table, name, command, using, check in POLICIES:
        sql = f"CREATE POLICY {name} ON {table} FOR {command} TO {GROUP}"
        if using is not None:
            sql += f" USING ({using})"
        if check is not None:
            sql += f" WITH CHECK ({check})"
        op.execute(sql)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, name, *_ in POLICIES:
            op.execute(f"DROP POLICY IF EXISTS {name} ON {table}")
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
            op.execute(f"REVOKE ALL ON {table} FROM {GROUP}")
        op.execute(f"REVOKE ALL ON settings, alembic_version FROM {GROUP}")
        op.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {GROUP}")
        op.execute(
            "DROP FUNCTION IF EXISTS crossintercom_addressed(text), crossintercom_sender(text), "
            "crossintercom_host()"
        )
    op.drop_table("host_roles")
