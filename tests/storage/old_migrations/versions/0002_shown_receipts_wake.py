"""shown receipts and wake policies: receipts.sender_session, roster.wake

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Whom to tell on the sender's host: a `shown` receipt can come days after the send, when
    # the sender's relay no longer remembers who sent the message.
    op.add_column("receipts", sa.Column("sender_session", sa.String(64), nullable=True))
    # A session's wake policy, so a sender on another host can see it; NULL means 'every'.
    op.add_column("roster", sa.Column("wake", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("roster") as batch:
        batch.drop_column("wake")
    with op.batch_alter_table("receipts") as batch:
        batch.drop_column("sender_session")
