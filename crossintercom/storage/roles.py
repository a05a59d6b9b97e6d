"""Per-host roles on PostgreSQL (`crossintercom db grant-host`, DESIGN §7).

An admin (the role that owns the tables and runs the migrations) gives each host a role of its
own; row-level security (storage/schema/postgres.sql) then limits that role to its host's rows in
this store. The role's name is derived from the store's database and the host id: running the
command again updates the same role, and the same host id in a second store on the same server
gets a second role (and password). docs/operations.md, "Per-host roles on PostgreSQL".
"""

from __future__ import annotations

import hashlib
from typing import Any, TypeVar, cast

import psycopg
from sqlalchemy import Connection

from crossintercom.errors import StoreError
from crossintercom.storage import queries as q
from crossintercom.storage.blocking import run
from crossintercom.storage.driver import Body
from crossintercom.storage.pgdriver import PgDriver
from crossintercom.storage.urls import StoreURL, parse_store_url

T = TypeVar("T")


def _key(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def role_name(host_id: str, database: str) -> str:
    """The role of ``host_id`` in the store held by ``database``: a plain identifier."""
    return f"ci_{_key(database, 8)}_{_key(host_id, 16)}"


LOCKED = "only the host roles may connect to it, and no role but the admin makes temporary objects"


def _not_owner(database: str, role: str | None) -> str:
    grant = f"; GRANT CONNECT ON DATABASE {database} TO {role}" if role is not None else ""
    return (
        f"this role does not own the database {database!r}: it could not stop other roles "
        f"connecting and making temporary objects there. Its owner should run: REVOKE "
        f"TEMPORARY, CONNECT ON DATABASE {database} FROM PUBLIC{grant} (docs/operations.md)"
    )


def _lock(conn: Connection, role: str | None) -> str:
    """PUBLIC loses TEMPORARY and CONNECT on the store's database and ``role`` gets CONNECT,
    when the connected role may do so; a line saying what was done, or what is left to do."""
    database = conn.execute(q.PG_CURRENT_DATABASE).scalar_one()
    if not conn.execute(q.PG_OWNS_DATABASE).scalar():
        return _not_owner(database, role)
    # Every mapped role keeps its way in (roles granted before this step existed too).
    mapped = set(conn.execute(q.PG_MAPPED_ROLES).scalars())
    for name in sorted(mapped | ({role} if role is not None else set())):
        conn.exec_driver_sql(conn.execute(q.PG_GRANT_CONNECT, {"role": name}).scalar_one())
    conn.exec_driver_sql(conn.execute(q.PG_LOCK_DATABASE).scalar_one())
    return f"database {database!r}: {LOCKED}"


def _once(parsed: StoreURL, fn: Body[T]) -> T:
    """``fn`` as one transaction through the store's driver (one connection, closed after),
    on the blocking callers' loop: an operator's command, run once."""

    async def go() -> T:
        driver = PgDriver(parsed, pool_size=1)
        try:
            return await driver.run(fn, retry=False)
        finally:
            await driver.aclose()

    return run(go())


def _postgres(url: str, what: str) -> StoreURL:
    parsed = parse_store_url(url)
    if parsed.kind != "postgres":
        raise StoreError(
            f"{what} need PostgreSQL; the store {parsed.masked} is a SQLite file, whose "
            "trust boundary is its file permissions (docs/operations.md)"
        )
    return parsed


def lock_database(url: str) -> str | None:
    """`db upgrade`'s last step on PostgreSQL once the store has host roles (see ``_lock``);
    None on SQLite or while no host role exists (nothing to protect the store from yet)."""
    parsed = parse_store_url(url)
    if parsed.kind != "postgres":
        return None

    def write(conn: Connection) -> str | None:
        if not conn.execute(q.PG_PRIVATE_HINTS).scalar():
            return None
        return _lock(conn, None)

    return _once(parsed, write)


def grant_host(url: str, host_id: str, password: str | None = None) -> tuple[str, str]:
    """Create or update ``host_id``'s role (a login member of the hosts group) and map it to
    the host id; returns the role name and the line ``_lock`` gives. ``password`` None keeps
    the role's current one."""
    parsed = _postgres(url, "per-host roles")

    def write(conn: Connection) -> tuple[str, str]:
        role = role_name(host_id, conn.execute(q.PG_CURRENT_DATABASE).scalar_one())
        if conn.execute(q.PG_ROLE_EXISTS, {"role": role}).first() is None:
            conn.exec_driver_sql(conn.execute(q.PG_CREATE_ROLE, {"role": role}).scalar_one())
        if password is not None:
            # Hashed here, as psql's \password does: a statement the server refuses is shown
            # (in a -v traceback, in the server's log) with the hash, never the password.
            raw = conn.connection.driver_connection
            pgconn = cast(psycopg.AsyncConnection[Any], raw).pgconn
            hashed = pgconn.encrypt_password(password.encode(), role.encode()).decode()
            stmt = conn.execute(q.PG_ROLE_PASSWORD, {"role": role, "pw": hashed}).scalar_one()
            conn.exec_driver_sql(stmt)
        conn.exec_driver_sql(conn.execute(q.PG_GRANT_GROUP, {"role": role}).scalar_one())
        conn.execute(q.FORGET_HOST_ROLE, {"host_id": host_id, "role": role})
        conn.execute(q.INSERT_HOST_ROLE, {"host_id": host_id, "role": role})
        return role, _lock(conn, role)

    return _once(parsed, write)
