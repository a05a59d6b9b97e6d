"""initial schema: hosts, roster, messages, deliveries, receipts, settings

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of what the tables looked like at this revision; never import tables.py here.
SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
QUEUED = sa.text("state = 'queued'")
FINISHED = sa.text("state <> 'queued'")


def _partial(where: sa.TextClause) -> dict[str, Any]:
    return {"postgresql_where": where, "sqlite_where": where}


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("host_id", sa.String(255), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("heartbeat", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("host_id", name=op.f("pk_hosts")),
    )
    op.create_table(
        "messages",
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("sender_host", sa.String(255), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("message_id", name=op.f("pk_messages")),
    )
    op.create_index("ix_messages_sender_host", "messages", ["sender_host"])
    op.create_table(
        "receipts",
        sa.Column("id", SERIAL, autoincrement=True, nullable=False),
        sa.Column("sender_host", sa.String(255), nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("recipient_session", sa.String(64), nullable=False),
        sa.Column("recipient_host", sa.String(255), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("code", sa.String(64), nullable=True),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_receipts")),
    )
    op.create_index("ix_receipts_created", "receipts", ["created"])
    op.create_index("ix_receipts_sender", "receipts", ["sender_host", "id"])
    settings = op.create_table(
        "settings",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("max_message_bytes", sa.Integer(), nullable=False),
        sa.Column("retention_s", sa.Integer(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_settings_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_settings")),
    )
    assert settings is not None
    op.bulk_insert(settings, [{"id": 1, "max_message_bytes": 1_048_576, "retention_s": 604_800}])
    op.create_table(
        "deliveries",
        sa.Column("seq", SERIAL, autoincrement=True, nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("recipient_host", sa.String(255), nullable=False),
        sa.Column("recipient_session", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('queued', 'delivered', 'refused', 'expired')",
            name=op.f("ck_deliveries_state_valid"),
        ),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["messages.message_id"],
            name=op.f("fk_deliveries_message_id_messages"),
        ),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_deliveries")),
        sa.UniqueConstraint(
            "message_id",
            "recipient_session",
            name=op.f("uq_deliveries_message_id_recipient_session"),
        ),
    )
    op.create_index("ix_deliveries_expiry", "deliveries", ["expires_at"], **_partial(QUEUED))
    op.create_index(
        "ix_deliveries_inbound", "deliveries", ["recipient_host", "seq"], **_partial(QUEUED)
    )
    op.create_index("ix_deliveries_purge", "deliveries", ["finished_at"], **_partial(FINISHED))
    op.create_table(
        "roster",
        sa.Column("host_id", sa.String(255), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(64), nullable=True),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), nullable=True),
        sa.Column("purpose", sa.String(16), nullable=False),
        sa.Column("groups", sa.JSON(), nullable=False),
        sa.Column("durable", sa.Boolean(), nullable=False),
        sa.Column("online", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["host_id"], ["hosts.host_id"], name=op.f("fk_roster_host_id_hosts")
        ),
        sa.PrimaryKeyConstraint("host_id", "session_id", name=op.f("pk_roster")),
    )


def downgrade() -> None:
    op.drop_table("roster")
    op.drop_index("ix_deliveries_purge", table_name="deliveries")
    op.drop_index("ix_deliveries_inbound", table_name="deliveries")
    op.drop_index("ix_deliveries_expiry", table_name="deliveries")
    op.drop_table("deliveries")
    op.drop_table("settings")
    op.drop_index("ix_receipts_sender", table_name="receipts")
    op.drop_index("ix_receipts_created", table_name="receipts")
    op.drop_table("receipts")
    op.drop_index("ix_messages_sender_host", table_name="messages")
    op.drop_table("messages")
    op.drop_table("hosts")
