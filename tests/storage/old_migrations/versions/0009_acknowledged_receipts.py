"""the receipts policy accepts the ``acknowledged`` outcome

A recipient's host writes an ``acknowledged`` receipt for a message its session acknowledged
(docs/delivery.md#acknowledgement), on the same path as ``shown``. PostgreSQL's
``receipts_write`` policy (0007, its codes widened by 0008) lists the outcomes a host may
write; this revision adds ``acknowledged`` to it. SQLite has no policies: nothing to do there.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from tests.storage.old_migrations.policy_revisions import Policy, load_revision, replace_policies

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ADDED_OUTCOMES = ("acknowledged",)


def _receipts_policies() -> tuple[Policy, Policy]:
    """(``receipts_write`` as 0008 left it, the same with the wider outcome list)."""
    base = load_revision("0007_host_trust.py")
    codes = load_revision("0008_split_codes.py")
    (before,) = [p for p in codes._policies()[1] if p[1] == "receipts_write"]
    old, new = base._listed(base.OUTCOMES), base._listed((*base.OUTCOMES, *ADDED_OUTCOMES))
    table, name, command, using, check = before
    assert check is not None and old in check
    return before, (table, name, command, using, check.replace(old, new))


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies([_receipts_policies()[1]])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies([_receipts_policies()[0]])
