"""the receipts and deliveries policies accept the code ``sender_refused``

A session's inbound policy may refuse a sender (docs/agents.md#inbound-policy); the refusal's
receipt and the delivery's reason carry the new code. The three policies that check codes
(0007, widened by 0008; ``receipts_write`` also by 0009) take it. SQLite has no policies.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ADDED = ("sender_refused",)


def _module(file: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Policy = tuple[str, str, str, str | None, str | None]
CODES = (*_module("0008_split_codes.py", "crossintercom_migration_0008").CODES, *ADDED)


def _policies() -> tuple[list[Policy], list[Policy]]:
    """(the code-checking policies as 0009 left them, the same with this revision's codes)."""
    base = _module("0007_host_trust.py", "crossintercom_migration_0007")
    codes = _module("0008_split_codes.py", "crossintercom_migration_0008")
    receipts = _module("0009_acknowledged_receipts.py", "crossintercom_migration_0009")
    now = receipts._receipts_policies()[1]
    before = [now if p[1] == now[1] else p for p in codes._policies()[1]]
    old, new = base._listed(codes.CODES), base._listed(CODES)

    def widen(clause: str | None) -> str | None:
        return None if clause is None else clause.replace(old, new)

    return before, [(t, n, c, widen(u), widen(k)) for t, n, c, u, k in before]


def _replace(policies: Sequence[Policy]) -> None:
    for table, name, *_ in policies:
        op.execute(f"DROP POLICY IF EXISTS {name} ON {table}")
    _module("0007_host_trust.py", "crossintercom_migration_0007")._create_policies(policies)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _replace(_policies()[1])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _replace(_policies()[0])
