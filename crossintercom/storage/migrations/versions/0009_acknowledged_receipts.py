"""the receipts policy accepts the ``acknowledged`` outcome

A recipient's host writes an ``acknowledged`` receipt for a message its session acknowledged
(docs/delivery.md#acknowledgement), on the same path as ``shown``. PostgreSQL's
``receipts_write`` policy (0007, its codes widened by 0008) lists the outcomes a host may
write; this revision adds ``acknowledged`` to it. SQLite has no policies: nothing to do there.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ADDED_OUTCOMES = ("acknowledged",)


def _module(file: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Policy = tuple[str, str, str, str | None, str | None]


def _receipts_policies() -> tuple[Policy, Policy]:
    """(``receipts_write`` as 0008 left it, the same with the wider outcome list)."""
    base = _module("0007_host_trust.py", "crossintercom_migration_0007")
    codes = _module("0008_split_codes.py", "crossintercom_migration_0008")
    (before,) = [p for p in codes._policies()[1] if p[1] == "receipts_write"]
    old, new = base._listed(base.OUTCOMES), base._listed((*base.OUTCOMES, *ADDED_OUTCOMES))
    table, name, command, using, check = before
    assert check is not None and old in check
    return before, (table, name, command, using, check.replace(old, new))


def _replace(policy: Policy) -> None:
    op.execute(f"DROP POLICY IF EXISTS {policy[1]} ON {policy[0]}")
    _module("0007_host_trust.py", "crossintercom_migration_0007")._create_policies([policy])


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _replace(_receipts_policies()[1])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _replace(_receipts_policies()[0])
