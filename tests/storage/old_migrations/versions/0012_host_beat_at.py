"""hosts.beat_at: when the host's heartbeat last moved, by the database's clock

The heartbeat stays a counter that relays judge on their own clocks (docs/storage.md); this
time is for people: the overseer page's "dead since" of a host that died before the page
started. A trigger sets it on every claim and heartbeat, so no statement of a host writes it
and no host role is granted it: a host cannot make itself look alive (docs/web.md, "Hosts").

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PG = (
    # Its own search_path and a qualified now(): a host role's session cannot shadow it.
    "CREATE FUNCTION crossintercom_host_beat_at() RETURNS trigger LANGUAGE plpgsql "
    "SET search_path = pg_catalog, pg_temp "
    "AS $$ BEGIN NEW.beat_at := pg_catalog.now(); RETURN NEW; END $$",
    "CREATE TRIGGER hosts_beat_at BEFORE INSERT OR UPDATE OF heartbeat, generation ON hosts "
    "FOR EACH ROW EXECUTE FUNCTION crossintercom_host_beat_at()",
)
# SQLite cannot assign NEW: the row is stamped after the write (recursive triggers are off).
SQLITE = (
    "CREATE TRIGGER hosts_beat_at_insert AFTER INSERT ON hosts BEGIN "
    "UPDATE hosts SET beat_at = CURRENT_TIMESTAMP WHERE host_id = NEW.host_id; END",
    "CREATE TRIGGER hosts_beat_at AFTER UPDATE OF heartbeat, generation ON hosts BEGIN "
    "UPDATE hosts SET beat_at = CURRENT_TIMESTAMP WHERE host_id = NEW.host_id; END",
)


def upgrade() -> None:
    op.add_column("hosts", sa.Column("beat_at", sa.DateTime(timezone=True), nullable=True))
    for stmt in PG if op.get_bind().dialect.name == "postgresql" else SQLITE:
        op.execute(stmt)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS hosts_beat_at ON hosts")
        op.execute("DROP FUNCTION IF EXISTS crossintercom_host_beat_at()")
    else:
        op.execute("DROP TRIGGER IF EXISTS hosts_beat_at_insert")
        op.execute("DROP TRIGGER IF EXISTS hosts_beat_at")
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("beat_at")
