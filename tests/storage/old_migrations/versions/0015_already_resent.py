"""the receipts and deliveries policies accept the code ``already_resent``

A second ``resend`` of one dead letter is refused with a code of its own (docs/delivery.md,
"Dead letters") instead of ``invalid_argument``. The refusal is the sending broker's and never
reaches the store, but the three policies that check codes take every code of the list
(docs/protocol.md#codes), so they are widened as 0010 and 0011 widened them, written as 0014
left them (the host asked once per statement). SQLite has no policies.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from tests.storage.old_migrations.policy_revisions import (
    Policy,
    load_revision,
    once_per_statement,
    replace_policies,
    widen,
)

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen with this revision: the codes codes.Code gained since 0011.
ADDED = ("already_resent",)

CODES = (*load_revision("0011_reservations.py").CODES, *ADDED)


def _policies() -> tuple[list[Policy], list[Policy]]:
    """(the code-checking policies as 0014 left them, the same with this revision's codes)."""
    base = load_revision("0007_host_trust.py")
    codes = load_revision("0011_reservations.py")
    (receipts,) = load_revision("0013_ack_note.py")._receipts_policies()[1:]
    before = once_per_statement([receipts if p[1] == receipts[1] else p for p in codes._codes()[1]])
    return before, widen(before, base._listed(codes.CODES), base._listed(CODES))


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies(_policies()[1])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies(_policies()[0])
