"""hosts.roster_rev: a counter bumped by every roster change of the host, so the other relays
re-read rosters when one moved instead of every second

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "hosts", sa.Column("roster_rev", sa.BigInteger(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("roster_rev")
