"""revision 0018's triggers fire for host roles alone; its check reads newest first (PostgreSQL)

The triggers, made again with a WHEN that leaves out superusers and roles that are not host
roles, and the finish check, which looks for the receipt among the sender's newest instead of
reading every one its host has not read, are the section "revision 0019" of
storage/schema/postgres.sql, run as written there; SQLite has no roles, and nothing changes in
its file.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from crossintercom.storage import schema

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema.create(op.get_bind(), revision)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    # 0018's section made the functions and the triggers together: dropped, it runs again.
    conn.exec_driver_sql("DROP TRIGGER deliveries_finish_told ON deliveries")
    conn.exec_driver_sql("DROP TRIGGER receipts_created ON receipts")
    conn.exec_driver_sql(
        "DROP FUNCTION public.crossintercom_finish_told(), public.crossintercom_receipt_created()"
    )
    schema.create(conn, "0018")
