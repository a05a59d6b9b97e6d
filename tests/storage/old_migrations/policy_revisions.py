"""What the revisions that widen PostgreSQL's row-security policies share (0008 on): another
revision's script read as a module (the scripts are data, not a package), and policies
replaced in place with 0007's statements (docs/operations.md, "Per-host roles")."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from alembic import op

VERSIONS = Path(__file__).parent / "versions"
# (table, name, command, USING, WITH CHECK), as 0007 lists its policies.
Policy = tuple[str, str, str, str | None, str | None]


def load_revision(file: str) -> Any:
    """The revision script ``file`` of migrations/versions, loaded as a module."""
    name = "crossintercom_migration_" + file.split("_", 1)[0]
    spec = importlib.util.spec_from_file_location(name, VERSIONS / file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rewritten(policies: Sequence[Policy], rewrite: Callable[[str], str]) -> list[Policy]:
    """``policies`` with ``rewrite`` applied to both clauses (where there is one)."""

    def one(clause: str | None) -> str | None:
        return None if clause is None else rewrite(clause)

    return [
        (table, name, cmd, one(using), one(check)) for table, name, cmd, using, check in policies
    ]


def widen(policies: Sequence[Policy], old: str, new: str) -> list[Policy]:
    """``policies`` with the listed values ``old`` replaced by ``new`` in both clauses."""
    return _rewritten(policies, lambda clause: clause.replace(old, new))


def once_per_statement(policies: Sequence[Policy]) -> list[Policy]:
    """``policies`` written as revision 0014 writes them: every call of the role's host as a
    scalar subquery (what every revision after 0014 must install)."""
    return _rewritten(policies, load_revision("0014_host_once_per_statement.py").once)


def replace_policies(policies: Sequence[Policy]) -> None:
    """Drop and create ``policies`` in the revision's transaction: relays' statements wait on
    the tables' locks for its duration and go on under the new policies."""
    for table, name, *_ in policies:
        op.execute(f"DROP POLICY IF EXISTS {name} ON {table}")
    load_revision("0007_host_trust.py")._create_policies(policies)
