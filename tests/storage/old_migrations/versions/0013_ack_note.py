"""receipts carry an acknowledgement's note

An ``acknowledged`` receipt brings the recipient's note to a sender on another host
(docs/delivery.md#acknowledgement): ``receipts.note``, at most 1,000 characters. It is the one
free text a host writes into another host's receipts, so on PostgreSQL ``receipts_write`` (as
0011 left it) also requires the note to be empty on every other outcome. A host role inserts
the column under that policy and cannot update it (0007 grants UPDATE column by column; the
note is not among them).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from tests.storage.old_migrations.policy_revisions import Policy, load_revision, replace_policies

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen with this revision (models.ACK_NOTE_CHARS of its time).
NOTE_CHARS = 1000
NOTE_OK = "(note IS NULL OR outcome = 'acknowledged')"


def _receipts_policies() -> tuple[Policy, Policy]:
    """(``receipts_write`` as 0011 left it, the same with the note's rule)."""
    (before,) = [
        p for p in load_revision("0011_reservations.py")._codes()[1] if p[1] == "receipts_write"
    ]
    table, name, command, using, check = before
    assert check is not None
    return before, (table, name, command, using, f"({check}) AND {NOTE_OK}")


def upgrade() -> None:
    op.add_column("receipts", sa.Column("note", sa.String(NOTE_CHARS), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        replace_policies([_receipts_policies()[1]])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies([_receipts_policies()[0]])
    with op.batch_alter_table("receipts") as batch:
        batch.drop_column("note")
