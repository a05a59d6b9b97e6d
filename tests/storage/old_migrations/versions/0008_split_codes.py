"""the receipts and deliveries policies accept the codes added since 0007

``relay_in_use`` meant two things and is now two codes (``relay_already_connected``: the
broker's refusal of a second relay connection; ``relay_already_running``: a relay process
already holds this host's lock), and every error a command ends with carries a code of the
list (docs/protocol.md#codes). The policies that check a receipt's ``code`` and a delivery's
``reason`` take every code of the list, as 0007 did; the old ``relay_in_use`` stays accepted
(a relay of an older version may still write it during an upgrade).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from alembic import op

from tests.storage.old_migrations.policy_revisions import (
    Policy,
    load_revision,
    replace_policies,
    widen,
)

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen with this revision: the codes errors.Code gained since 0007. A code added later needs
# a migration that widens the list again (tests/storage/test_host_roles_attack.py checks that
# none is missing).
ADDED = (
    "relay_already_connected", "relay_already_running", "error", "invalid_argument",
    "invalid_config", "runtime_dir", "bad_frame", "lock_held", "authority_corrupt",
    "authority_unavailable", "store_error", "bad_store_url", "schema_missing", "schema_too_new",
    "schema_outdated", "store_fenced", "store_read_only", "relay_error", "host_id_collision",
    "relay_fenced", "invalid_escalation", "waiter_busy", "not_online", "unknown_tool",
    "unknown_host", "bad_token", "csrf", "abandoned",
)  # fmt: skip


def _previous() -> Any:
    """Revision 0007's module: its code list and policies, to widen and to restore."""
    return load_revision("0007_host_trust.py")


def _policies() -> tuple[list[Policy], list[Policy]]:
    """(0007's policies that check codes, the same policies with this revision's list)."""
    old = _previous()
    before, after = old._listed(old.CODES), old._listed((*old.CODES, *ADDED))
    checking: list[Policy] = [p for p in old.POLICIES if before in f"{p[3]} {p[4]}"]
    # deliveries_send, deliveries_finish (a delivery's reason) and receipts_write (its code)
    assert len(checking) == 3, [p[1] for p in checking]

    return checking, widen(checking, before, after)


CODES = (*_previous().CODES, *ADDED)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies(_policies()[1])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies(_policies()[0])
