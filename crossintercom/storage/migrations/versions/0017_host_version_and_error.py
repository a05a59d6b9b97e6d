"""each host's crossintercom version and its relay's last error, on the hosts table

The columns (bounded), and on PostgreSQL the host roles' right to update them, are the section
"revision 0017" of storage/schema/postgres.sql or sqlite.sql, run as written there; the row a
host may update is its own, by the hosts_bump policy the baseline made.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from crossintercom.storage import schema

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("version", "last_error_code", "last_error", "last_error_at")


def upgrade() -> None:
    schema.create(op.get_bind(), revision)


def downgrade() -> None:
    # Dropping a column drops its grants with it (PostgreSQL); SQLite drops one at a time.
    for column in _COLUMNS:
        op.get_bind().exec_driver_sql(f"ALTER TABLE hosts DROP COLUMN {column}")
