"""row security asks who the role is once per statement, not once per row

Every policy on PostgreSQL compares a row with ``crossintercom_host()``, the host of the
session's role. The function is ``SECURITY DEFINER`` with its own ``search_path`` (so that no
object a role makes can stand in for what it reads), and such a function is never inlined: a
bare call ran once or more for every row a statement touched, each a switch of user and
settings and a lookup in ``host_roles``. Written as a scalar subquery, ``(SELECT
public.crossintercom_host())``, it does not depend on the row and the server runs it once per
statement (an InitPlan). What each policy allows is unchanged: the same function, the same
comparisons; docs/operations.md, "Per-host roles", and docs/performance.md for what it moved.

The policies are rewritten as the catalog holds them (whatever codes the revisions before
widened them with). tests/storage/test_installed_policies.py checks that every installed policy
calls the function only inside a subquery, so a later revision that creates policies afresh
must write them this way too.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# How the server prints the function's call in a policy, bare and as the subquery.
_BARE = re.compile(r"(?:public\.)?crossintercom_host\(\)")
_WRAPPED = re.compile(
    r"\(\s*SELECT\s+(?:public\.)?crossintercom_host\(\)(?:\s+AS\s+crossintercom_host)?\s*\)"
)
ONCE = "(SELECT public.crossintercom_host())"


def bare(clause: str) -> str:
    """``clause`` with every call of the function written as a plain call."""
    return _WRAPPED.sub("crossintercom_host()", clause)


def once(clause: str) -> str:
    """``clause`` with every call of the function written as a scalar subquery."""
    return _BARE.sub(ONCE, bare(clause))


def _rewrite(how: Callable[[str], str]) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    # Printed and read back with only the catalog and the store's schema on the path: nothing
    # of the session's own (a temporary table) can be read into a policy. The revisions after
    # this one run with the path as it was.
    path = bind.execute(sa.text("SELECT pg_catalog.current_setting('search_path')")).scalar()
    op.execute("SET LOCAL search_path = pg_catalog, public, pg_temp")
    rows = bind.execute(
        sa.text(
            "SELECT tablename, policyname, qual, with_check FROM pg_catalog.pg_policies "
            "WHERE schemaname = 'public' ORDER BY tablename, policyname"
        )
    ).all()
    for table, name, using, check in rows:
        clauses = []
        for keyword, clause in (("USING", using), ("WITH CHECK", check)):
            if clause is not None and how(clause) != clause:
                clauses.append(f"{keyword} ({how(clause)})")
        if clauses:
            quoted = bind.dialect.identifier_preparer.quote_identifier
            target = f"{quoted(name)} ON public.{quoted(table)}"
            op.execute(f"ALTER POLICY {target} {' '.join(clauses)}")
    restore = sa.text("SELECT pg_catalog.set_config('search_path', :path, true)")
    bind.execute(restore, {"path": path})


def upgrade() -> None:
    _rewrite(once)


def downgrade() -> None:
    _rewrite(bare)
