"""Per-host database roles on PostgreSQL (`crossintercom db grant-host`, DESIGN §7).

An admin (the role that owns the tables and runs the migrations) gives each host a role of its
own; row-level security (migration 0004) then limits that role to its host's rows. The role's
name is derived from the host id, so running the command again updates the same role.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Connection

from crossintercom.errors import StoreError
from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage.transaction import TransactionRunner
from crossintercom.storage.urls import parse_store_url


def role_name(host_id: str) -> str:
    """The database role of ``host_id``: stable, a plain identifier, under 63 bytes."""
    return "ci_host_" + hashlib.sha256(host_id.encode()).hexdigest()[:16]


def grant_host(url: str, host_id: str, password: str | None = None) -> str:
    """Create or update ``host_id``'s role (a login member of the hosts group) and map it to
    the host id; returns the role name. ``password`` None keeps the role's current one."""
    parsed = parse_store_url(url)
    if parsed.kind != "postgres":
        raise StoreError(
            f"per-host roles need PostgreSQL; the store {parsed.masked} is a SQLite file, whose "
            "trust boundary is its file permissions (docs/operations.md)"
        )
    role = role_name(host_id)
    engine = db.store_engine(parsed)

    def write(conn: Connection) -> None:
        if conn.execute(q.PG_ROLE_EXISTS, {"role": role}).first() is None:
            conn.exec_driver_sql(conn.execute(q.PG_CREATE_ROLE, {"role": role}).scalar_one())
        if password is not None:
            stmt = conn.execute(q.PG_ROLE_PASSWORD, {"role": role, "pw": password}).scalar_one()
            conn.exec_driver_sql(stmt)
        conn.exec_driver_sql(conn.execute(q.PG_GRANT_GROUP, {"role": role}).scalar_one())
        conn.execute(q.FORGET_HOST_ROLE, {"host_id": host_id, "role": role})
        conn.execute(q.INSERT_HOST_ROLE, {"host_id": host_id, "role": role})

    try:
        TransactionRunner(parsed, engine)(write, retry=False)
    finally:
        engine.dispose()
    return role
