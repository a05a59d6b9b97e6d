"""host roles' checks made cheaper, and skipped for superusers (PostgreSQL)

Revision 0018's triggers, made again with a WHEN that leaves out superusers and roles that are
not host roles; its finish check, which looks for the receipt among the sender's newest instead
of reading every one its host has not read; and the policies' row-dependent functions, which
read host_roles themselves instead of calling crossintercom_host() per row. The section
"revision 0019" of storage/schema/postgres.sql, run as written there; SQLite has no roles, and
nothing changes in its file.

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

# The two functions as the baseline made them (a frozen copy: the downgrade must not follow
# later edits of the schema file).
_BASELINE_FUNCTIONS = """
CREATE OR REPLACE FUNCTION public.crossintercom_addressed(mid text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS
    $$ SELECT EXISTS (SELECT 1 FROM public.deliveries AS d
                      WHERE d.message_id::text OPERATOR(pg_catalog.=) mid
                        AND d.recipient_host::text OPERATOR(pg_catalog.=)
                            public.crossintercom_host()) $$;
CREATE OR REPLACE FUNCTION public.crossintercom_received(
    mid text, session text, sender_session text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS
    $$ SELECT EXISTS (
           SELECT 1 FROM public.deliveries AS d
           JOIN public.messages AS m ON m.message_id::text OPERATOR(pg_catalog.=) d.message_id::text
           WHERE d.message_id::text OPERATOR(pg_catalog.=) mid
             AND d.recipient_session::text OPERATOR(pg_catalog.=) session
             AND d.recipient_host::text OPERATOR(pg_catalog.=) public.crossintercom_host()
             AND (sender_session IS NULL
                  OR (m.payload OPERATOR(pg_catalog.->) 'from')
                     OPERATOR(pg_catalog.->>) 'id' OPERATOR(pg_catalog.=) sender_session)) $$;
"""


def upgrade() -> None:
    schema.create(op.get_bind(), revision)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    conn.exec_driver_sql(_BASELINE_FUNCTIONS)
    # 0018's section made its functions and triggers together: dropped, it runs again.
    conn.exec_driver_sql("DROP TRIGGER deliveries_finish_told ON deliveries")
    conn.exec_driver_sql("DROP TRIGGER receipts_created ON receipts")
    conn.exec_driver_sql(
        "DROP FUNCTION public.crossintercom_finish_told(), public.crossintercom_receipt_created()"
    )
    schema.create(conn, "0018")
