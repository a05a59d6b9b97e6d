"""path reservations: the ``reservations`` table, and on PostgreSQL the rights and row security
that let a host role read every reservation of its store but write and delete only its own
host's, at its current generation; the code-checking policies take the codes added with it

docs/agents.md#path-reservations; the trust model in docs/operations.md, "Per-host roles".

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from tests.storage.old_migrations.policy_revisions import (
    Policy,
    load_revision,
    replace_policies,
    widen,
)

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen with this revision: the codes errors.Code gained since 0010.
ADDED = ("reservation_conflict", "relay_not_running")

_ME = "public.crossintercom_host()"
# A row is made only as the role's own host, at that host's current generation (the fence a
# relay's statement applies, held here for any statement a host role runs).
POLICIES: tuple[Policy, ...] = (
    ("reservations", "reservations_read", "SELECT", f"{_ME} IS NOT NULL", None),
    (
        "reservations",
        "reservations_make",
        "INSERT",
        None,
        f"host_id = {_ME} AND generation = (SELECT h.generation FROM public.hosts AS h "
        f"WHERE h.host_id = {_ME})",
    ),
    ("reservations", "reservations_release", "DELETE", f"host_id = {_ME}", None),
)


def _codes() -> tuple[list[Policy], list[Policy]]:
    """(the code-checking policies as 0010 left them, the same with this revision's codes)."""
    base = load_revision("0007_host_trust.py")
    previous = load_revision("0010_sender_refused.py")
    now = previous._policies()[1]
    return now, widen(now, base._listed(previous.CODES), base._listed((*previous.CODES, *ADDED)))


CODES = (*load_revision("0010_sender_refused.py").CODES, *ADDED)


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("project", sa.String(255), nullable=False),
        sa.Column("glob", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("host_id", sa.String(255), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text()),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reservations")),
        sa.UniqueConstraint(
            "project", "session_id", "glob", name=op.f("uq_reservations_project_session_id_glob")
        ),
        sa.CheckConstraint(
            "mode IN ('exclusive', 'shared')", name=op.f("ck_reservations_mode_valid")
        ),
    )
    op.create_index("ix_reservations_host_id", "reservations", ["host_id", "session_id"])
    if op.get_bind().dialect.name != "postgresql":
        return
    group = load_revision("0007_host_trust.py").GROUP
    # No UPDATE: a host role renews by deleting and inserting, under the policies below.
    op.execute(f"GRANT SELECT, INSERT, DELETE ON reservations TO {group}")
    op.execute("ALTER TABLE reservations ENABLE ROW LEVEL SECURITY")
    load_revision("0007_host_trust.py")._create_policies(POLICIES)
    replace_policies(_codes()[1])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies(_codes()[0])
    op.drop_index("ix_reservations_host_id", table_name="reservations")
    op.drop_table("reservations")
