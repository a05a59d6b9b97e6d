"""the receipts and deliveries policies accept the code ``sender_refused``

A session's inbound policy may refuse a sender (docs/agents.md#inbound-policy); the refusal's
receipt and the delivery's reason carry the new code. The three policies that check codes
(0007, widened by 0008; ``receipts_write`` also by 0009) take it. SQLite has no policies.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from tests.storage.old_migrations.policy_revisions import (
    Policy,
    load_revision,
    replace_policies,
    widen,
)

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ADDED = ("sender_refused",)

CODES = (*load_revision("0008_split_codes.py").CODES, *ADDED)


def _policies() -> tuple[list[Policy], list[Policy]]:
    """(the code-checking policies as 0009 left them, the same with this revision's codes)."""
    base = load_revision("0007_host_trust.py")
    codes = load_revision("0008_split_codes.py")
    receipts = load_revision("0009_acknowledged_receipts.py")
    now = receipts._receipts_policies()[1]
    before = [now if p[1] == now[1] else p for p in codes._policies()[1]]
    old, new = base._listed(codes.CODES), base._listed(CODES)
    return before, widen(before, old, new)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies(_policies()[1])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies(_policies()[0])
