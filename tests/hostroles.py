"""Per-host roles made for a test, and their removal (a role with a right on a database cannot
be dropped until the right is gone)."""

from __future__ import annotations

from collections.abc import Iterable

from psycopg import sql
from sqlalchemy.engine import make_url

from tests.pgharness import PgServer


def drop_host_roles(server: PgServer, roles: Iterable[str], store_url: str) -> None:
    database = make_url(store_url).database or ""
    with server.admin() as admin:
        for role in roles:
            exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            if exists is None:
                continue
            admin.execute(
                sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(
                    sql.Identifier(database), sql.Identifier(role)
                )
            )
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def role_url(store_url: str, role: str, password: str) -> str:
    """``store_url`` connecting as ``role``."""
    return make_url(store_url).set(username=role, password=password).render_as_string(False)
