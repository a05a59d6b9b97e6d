"""archive: opt-in searchable history (archive_settings, archive_messages, archive_recipients)
and its full-text index, one per dialect

Revision ID: 0005
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of what the tables looked like at this revision; never import tables.py here.
SERIAL = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# The full-text index is outside the metadata (tables.outside_metadata): PostgreSQL indexes an
# expression with GIN; SQLite keeps an FTS5 table over archive_messages (external content, so
# the text is stored once) that triggers keep in step. The archive is insert-only, so no
# UPDATE trigger is needed.
PG_FTS = (
    "CREATE INDEX ix_archive_messages_fts ON archive_messages USING gin "
    "(to_tsvector('english'::regconfig, coalesce(subject, '') || ' ' || body))"
)
SQLITE_FTS = (
    "CREATE VIRTUAL TABLE archive_fts USING fts5(subject, body, content='archive_messages', "
    "content_rowid='seq', tokenize='porter unicode61 remove_diacritics 2')",
    "CREATE TRIGGER archive_fts_insert AFTER INSERT ON archive_messages BEGIN "
    "INSERT INTO archive_fts (rowid, subject, body) VALUES (new.seq, new.subject, new.body); END",
    "CREATE TRIGGER archive_fts_delete AFTER DELETE ON archive_messages BEGIN "
    "INSERT INTO archive_fts (archive_fts, rowid, subject, body) "
    "VALUES ('delete', old.seq, old.subject, old.body); END",
)


def upgrade() -> None:
    op.create_table(
        "archive_settings",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("retention_s", sa.Integer(), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_archive_settings_single_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_archive_settings")),
    )
    op.create_table(
        "archive_messages",
        sa.Column("seq", SERIAL, autoincrement=True, nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("thread_id", sa.String(128), nullable=False),
        sa.Column("subject", sa.Text(), nullable=True),
        sa.Column("sender_id", sa.String(64), nullable=False),
        sa.Column("sender_name", sa.String(64), nullable=True),
        sa.Column("sender_host", sa.String(255), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("reply_to", sa.String(128), nullable=True),
        sa.Column("expects_reply", sa.Boolean(), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_archive_messages")),
        sa.UniqueConstraint("message_id", name=op.f("uq_archive_messages_message_id")),
    )
    op.create_index("ix_archive_messages_thread_id", "archive_messages", ["thread_id", "seq"])
    op.create_index("ix_archive_messages_sender_host", "archive_messages", ["sender_host"])
    op.create_index("ix_archive_messages_archived_at", "archive_messages", ["archived_at"])
    op.create_table(
        "archive_recipients",
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("host_id", sa.String(255), nullable=False),
        sa.Column("name", sa.String(64), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("code", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("message_id", "session_id", name=op.f("pk_archive_recipients")),
    )
    op.create_index("ix_archive_recipients_host_id", "archive_recipients", ["host_id"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FTS)
    else:
        for statement in SQLITE_FTS:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_archive_messages_fts")
    else:
        op.execute("DROP TRIGGER IF EXISTS archive_fts_insert")
        op.execute("DROP TRIGGER IF EXISTS archive_fts_delete")
        op.execute("DROP TABLE IF EXISTS archive_fts")
    op.drop_table("archive_recipients")
    op.drop_table("archive_messages")
    op.drop_table("archive_settings")
