"""The migrations build exactly the tables the code declares, on both dialects, and the
schema checks refuse stores from another version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from crossintercom.errors import SchemaMissing, SchemaOutdated, SchemaTooNew
from crossintercom.storage import migrate, open_store, parse_store_url
from crossintercom.storage.blocking import open_blocking_store, run
from crossintercom.storage.tables import include_name, metadata


def _diff(url: str) -> list[object]:
    engine = create_engine(parse_store_url(url).url)
    try:
        with engine.connect() as conn:
            # The archive's full-text index is the migration's alone (docs/archive.md).
            context = MigrationContext.configure(conn, opts={"include_name": include_name})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(parse_store_url(url).url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.pg)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    url: str = request.getfixturevalue("pg_empty_url")
    return url


def test_upgrade_matches_metadata_and_downgrade_empties(empty_url: str) -> None:
    assert migrate.current(empty_url) is None
    assert migrate.upgrade(empty_url) == migrate.head_revision()
    assert _diff(empty_url) == []
    assert migrate.upgrade(empty_url) == migrate.head_revision()  # idempotent
    assert migrate.downgrade(empty_url, "base") is None
    assert _tables(empty_url) <= {"alembic_version"}
    migrate.upgrade(empty_url)
    store = run(open_store(empty_url))
    run(store.aclose())


def test_the_head_constant_is_alembics_head() -> None:
    """``HEAD_REVISION`` (what every opened store is checked against, without alembic) is the
    newest script: a new migration must change it."""
    assert migrate.scripts_head() == migrate.HEAD_REVISION


def test_the_relay_and_an_opened_store_do_not_import_alembic() -> None:
    code = (
        "import sys, crossintercom.relay.run, crossintercom.relay.service, "
        "crossintercom.storage.postgres, crossintercom.storage.sqlite\n"
        "assert 'alembic' not in sys.modules, sorted(m for m in sys.modules if 'alembic' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_missing_outdated_and_future_schemas_are_refused(empty_url: str) -> None:
    engine = create_engine(parse_store_url(empty_url).url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE unrelated (x INTEGER)"))
        with pytest.raises(SchemaMissing, match="crossintercom db upgrade --store"):
            open_blocking_store(empty_url).close()

        migrate.upgrade(empty_url)
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'ffff_from_the_future'"))
        with pytest.raises(SchemaTooNew, match="newer than this crossintercom"):
            open_blocking_store(empty_url).close()
        with pytest.raises(SchemaTooNew):
            migrate.upgrade(empty_url)

        # Simulate an older schema by pretending a newer head exists.
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE alembic_version SET version_num = :v"), {"v": migrate.head_revision()}
            )
    finally:
        engine.dispose()
    head = migrate.head_revision
    try:
        migrate.head_revision = lambda: "9999"
        with pytest.raises(SchemaOutdated, match="db upgrade"):
            open_blocking_store(empty_url).close()
    finally:
        migrate.head_revision = head


def test_sqlite_uses_a_rollback_journal(sqlite_url: str) -> None:
    store = run(open_store(sqlite_url))
    try:
        with store.driver.engine.connect() as conn:  # type: ignore[attr-defined]
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "delete"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30000
    finally:
        run(store.aclose())


def test_the_archive_command_checks_the_schema_through_the_store(empty_url: str) -> None:
    """`crossintercom archive` (and `search`) reach the archive through an opened store
    (``store.archive``, the same connection), whose opening checks the schema revision, and
    refuse a store of another revision with the store's own words."""
    from click.testing import CliRunner

    from crossintercom.cli.main import cli

    migrate.upgrade(empty_url)
    status = ["archive", "status", "--store", empty_url, "--json"]
    got = CliRunner().invoke(cli, status)
    assert got.exit_code == 0 and '"enabled": false' in got.output, got.output
    engine = create_engine(parse_store_url(empty_url).url)
    try:
        older = f"older than {migrate.HEAD_REVISION}"
        for version, words in (("0011", older), ("ffff", "newer than this")):
            with engine.begin() as conn:
                conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": version})
            got = CliRunner().invoke(cli, status)
            assert got.exit_code != 0 and words in got.output, got.output
    finally:
        engine.dispose()
