"""a host erases no other host's mail, and squats no other host's reservation

Two rules a host role could step around, found by attacking the store as one:

- **Deleting.** ``deliveries_purge`` and ``receipts_consume`` (0007) let the recipient's host
  delete a delivery still ``queued`` for it (its sender then never hears of it: no expiry, no
  receipt) and the receipts its sender had not read yet. Now a queued delivery is deleted by no
  host role (the purge takes finished rows only), and a receipt by its sender's host, or by the
  recipient's once the store's retention has passed (the purge of receipts whose sender is gone).
- **Reserving.** A reservation was unique by project, session and glob, and the policy let a
  host insert a row for any session id: a row planted for another host's session made that
  session's own reservation of the glob fail, and its host could not delete it. The key now
  holds the host as well; a planted row never counts (a session id belongs to one host's roster).

Written with the host asked once per statement (0014). docs/operations.md, "Per-host roles".

Revision ID: 0016
Revises: 0015
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
)

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RETAINED = (
    "created < pg_catalog.now() - pg_catalog.make_interval(secs => "
    "(SELECT s.retention_s FROM public.settings AS s WHERE s.id = 1))"
)


def _policies() -> tuple[list[Policy], list[Policy]]:
    """(the two deleting policies as 0014 left them, the same with this revision's rules)."""
    base = load_revision("0007_host_trust.py")
    me = base.ME
    before = [p for p in base.POLICIES if p[1] in ("deliveries_purge", "receipts_consume")]
    after: list[Policy] = [
        ("deliveries", "deliveries_purge", "DELETE", f"({base.MINE}) AND state <> 'queued'", None),
        (
            "receipts",
            "receipts_consume",
            "DELETE",
            f"sender_host = {me} OR (recipient_host = {me} AND {_RETAINED})",
            None,
        ),
    ]
    return once_per_statement(before), once_per_statement(after)


_OLD_KEY = ("uq_reservations_project_session_id_glob", ["project", "session_id", "glob"])
_NEW_KEY = (
    "uq_reservations_project_host_id_session_id_glob",
    ["project", "host_id", "session_id", "glob"],
)


def _key(drop: tuple[str, list[str]], make: tuple[str, list[str]]) -> None:
    with op.batch_alter_table("reservations") as batch:
        batch.drop_constraint(drop[0], type_="unique")
        batch.create_unique_constraint(make[0], make[1])


def upgrade() -> None:
    _key(_OLD_KEY, _NEW_KEY)
    if op.get_bind().dialect.name == "postgresql":
        replace_policies(_policies()[1])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        replace_policies(_policies()[0])
    _key(_NEW_KEY, _OLD_KEY)
