"""The shared store's schema, written whole once per dialect: ``postgres.sql`` (tables, the
per-host roles' rights, row-security policies and the owner-rights functions they call) and
``sqlite.sql`` (the same tables). The baseline revision runs the file of its dialect up to the
first later revision's section; each later revision runs its own section, which closes the
file under a line ``-- --- revision NNNN: ...`` (docs/storage.md, "Schema").

The codes and outcomes a row may carry are not frozen into the schema: the policies that check
them name ``@CODES@`` and ``@RECEIPT_OUTCOMES@``, filled in from ``codes.Code`` and
``models.RECEIPT_OUTCOMES`` when the file runs, and ``refresh`` (run by every ``db upgrade``)
writes them again into an existing store whose lists are behind. A new code needs no revision.
"""

from __future__ import annotations

import re
import sqlite3
from functools import cache
from importlib import resources
from typing import Final, NamedTuple

from sqlalchemy import Connection, text

from crossintercom.codes import RETIRED_CODES, Code
from crossintercom.models import RECEIPT_OUTCOMES

# Every table of the schema, dropped in this order by the baseline's downgrade.
TABLES: Final = (
    "reservations",
    "archive_recipients",
    "archive_messages",
    "archive_settings",
    "host_roles",
    "roster",
    "deliveries",
    "settings",
    "receipts",
    "messages",
    "hosts",
)
_PG_FUNCTIONS: Final = (
    "public.crossintercom_finish_told()",
    "public.crossintercom_receipt_created()",
    "public.crossintercom_host_beat_at()",
    "public.crossintercom_addressed(text)",
    "public.crossintercom_received(text, text, text)",
    "public.crossintercom_sender(text)",
    "public.crossintercom_private_hints()",
    "public.crossintercom_host()",
)
GROUP: Final = "crossintercom_hosts"


def accepted_codes() -> tuple[str, ...]:
    """The codes a delivery's reason or a receipt's code may be: every code of the list, and
    those an older relay may still write during an upgrade."""
    return (*(c.value for c in Code), *RETIRED_CODES)


def _listed(values: tuple[str, ...]) -> str:
    return "ARRAY[{}]::text[]".format(", ".join(f"'{v}'" for v in values))


def filled(sql: str) -> str:
    """``sql`` with the lists a row may carry written in."""
    return sql.replace("@CODES@", _listed(accepted_codes())).replace(
        "@RECEIPT_OUTCOMES@", _listed(tuple(RECEIPT_OUTCOMES))
    )


@cache
def source(dialect: str) -> str:
    """The schema file of ``dialect`` as shipped (placeholders not filled in)."""
    name = "postgres.sql" if dialect == "postgresql" else "sqlite.sql"
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


# A later revision's section starts at its heading line and runs to the next one or the end.
_SECTION = re.compile(r"^-- --- revision (\d{4}):", re.M)
BASELINE: Final = "0016"


def part(dialect: str, revision: str = BASELINE) -> str:
    """What ``revision`` runs of the schema file of ``dialect``: the baseline everything
    before the first section, a later revision its own section (none: an empty text)."""
    sql = source(dialect)
    marks = list(_SECTION.finditer(sql))
    if revision == BASELINE:
        return sql[: marks[0].start()] if marks else sql
    for i, m in enumerate(marks):
        if m.group(1) == revision:
            return sql[m.start() : marks[i + 1].start() if i + 1 < len(marks) else len(sql)]
    return ""


def _sqlite_statements(sql: str) -> list[str]:
    """``sql`` cut into statements (sqlite3 runs one at a time; a trigger holds ``;``)."""
    statements, current = [], ""
    for line in sql.splitlines(keepends=True):
        if not current and (not line.strip() or line.lstrip().startswith("--")):
            continue
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    assert not current.strip(), current
    return statements


def create(conn: Connection, revision: str = BASELINE) -> None:
    """Make the schema as ``revision`` has it (``part``) in ``conn``'s transaction."""
    sql = filled(part(conn.dialect.name, revision))
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(sql)  # one script: the server cuts it into statements
        return
    for statement in _sqlite_statements(sql):
        conn.exec_driver_sql(statement)


def drop(conn: Connection) -> None:
    """Drop every object ``create`` made (the group role is the server's, shared by every
    store on it: it stays)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {', '.join(TABLES)} CASCADE")
        conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {', '.join(_PG_FUNCTIONS)}")
        conn.exec_driver_sql(f"REVOKE ALL ON alembic_version FROM {GROUP}")
        return
    conn.exec_driver_sql("DROP TABLE IF EXISTS archive_fts")
    for table in TABLES:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")


class ListedCheck(NamedTuple):
    """A policy whose WITH CHECK names the lists (as written in postgres.sql)."""

    table: str
    name: str
    check: str


_POLICY = re.compile(r"CREATE POLICY (\w+) ON public\.(\w+) .*?;", re.S)
_WITH_CHECK = "WITH CHECK ("
_LITERAL = re.compile(r"'([^']*)'")


def listed_checks() -> tuple[ListedCheck, ...]:
    """The policies of postgres.sql whose check names ``@CODES@`` or ``@RECEIPT_OUTCOMES@``."""
    found = []
    for m in _POLICY.finditer(source("postgresql")):
        statement = m.group(0)
        if "@" in statement:
            start = statement.index(_WITH_CHECK) + len(_WITH_CHECK)
            found.append(ListedCheck(m.group(2), m.group(1), statement[start:-2]))
    return tuple(found)


def refresh(conn: Connection) -> list[str]:
    """Write the lists again into each listed policy of the store whose values differ from
    ``filled`` (a code or an outcome added since the store was made or last upgraded); the
    policy is otherwise left as it is. Returns the names of the policies rewritten. SQLite
    has no policies."""
    if conn.dialect.name != "postgresql":
        return []
    installed: dict[str, str | None] = dict(
        conn.execute(
            text(
                "SELECT policyname, with_check FROM pg_catalog.pg_policies "
                "WHERE schemaname = 'public'"
            )
        ).all()
    )
    rewritten = []
    for policy in listed_checks():
        now = installed.get(policy.name)
        want = filled(policy.check)
        if now is None or set(_LITERAL.findall(now)) == set(_LITERAL.findall(want)):
            continue
        target = f"{policy.name} ON public.{policy.table}"
        conn.exec_driver_sql(f"ALTER POLICY {target} WITH CHECK ({want})")
        rewritten.append(policy.name)
    return rewritten
