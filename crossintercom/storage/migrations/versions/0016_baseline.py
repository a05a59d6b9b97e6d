"""the whole schema, as version 0.1.0's revisions 0001 to 0016 left it, written once

The baseline: tables, the per-host roles' rights, row-security policies and the owner-rights
functions are read whole from storage/schema/postgres.sql or sqlite.sql. It carries the old
head's id: a store 0.1.0 brought to 0016 has exactly this schema
(tests/storage/test_baseline.py compares them) and is at head as it stands. A store at an
older revision of that chain is refused with what to do (storage/migrate.py). Later changes
are ordinary revisions with ``down_revision = "0016"``.

Revision ID: 0016
Revises:
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from crossintercom.storage import schema

revision: str = "0016"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema.create(op.get_bind())


def downgrade() -> None:
    schema.drop(op.get_bind())
