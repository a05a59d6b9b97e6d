"""Alembic, driven from code: the scripts ship inside the package (``storage/migrations/``), so
an installed wheel runs ``crossintercom db upgrade`` without an alembic.ini.

The engine comes from ``storage.engine`` (no store object is built: a migration runs before a
store can pass its schema check) and is handed to ``migrations/env.py`` through
``config.attributes``. Errors come back as ``StoreError`` subclasses, worded as a store's are.

Alembic is imported only where a migration runs or an unexpected revision is looked up: every
store opened checks its revision against ``HEAD_REVISION``, and importing alembic for that
cost each relay start and store command about 0.13 s (docs/perf-log/2026-12.md, "Catch-up: where
the time goes"). tests/storage/test_migrations.py keeps the constant equal to alembic's head.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from crossintercom.errors import SchemaMissing, SchemaOutdated, SchemaTooNew, StoreError
from crossintercom.storage import engine as db
from crossintercom.storage.urls import parse_store_url

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# The key under which env.py finds the engine to migrate with.
ENGINE_ATTRIBUTE = "engine"
# Set by ``upgrade``: env.py then writes the current lists of codes and outcomes into the
# policies that check them (storage/schema.refresh).
REFRESH_ATTRIBUTE = "refresh"
# The newest script in migrations/versions; a new migration changes it (a test says so).
HEAD_REVISION: Final = "0019"
# Version 0.1.0's revisions before its head: the baseline (0016) replaced them, so a store at
# one of them is brought to 0016 by 0.1.0 first (docs/storage.md, "Schema").
OLD_CHAIN: Final = frozenset(f"{n:04d}" for n in range(1, 16))


def script_location() -> str:
    return str(Path(str(resources.files("crossintercom.storage"))) / "migrations")


def alembic_config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", script_location())
    return cfg


@cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    return HEAD_REVISION


def scripts_head() -> str | None:
    """The head as alembic reads it from the scripts (what ``HEAD_REVISION`` must equal)."""
    return _scripts().get_current_head()


def known_revisions() -> set[str]:
    """Every revision a store of this crossintercom or an older one may be at."""
    return {rev.revision for rev in _scripts().walk_revisions()} | OLD_CHAIN


def read_revision(conn: Connection) -> str | None:
    """The store's schema revision as read on ``conn`` (None: no schema), without alembic."""
    from sqlalchemy import inspect

    from crossintercom.storage import queries as q

    if not inspect(conn).has_table("alembic_version"):
        return None
    version = conn.execute(q.SCHEMA_VERSION).scalar()
    return None if version is None else str(version)


def check_revision(version: str | None, masked: str) -> None:
    """Refuse a store whose schema revision is not this crossintercom's head, saying what to
    do: what every opened store and archive checks."""
    if version is None:
        raise SchemaMissing(
            f"the store {masked} has no crossintercom schema; "
            f"run `crossintercom db upgrade --store {masked}`"
        )
    head = head_revision()
    if version == head:
        return
    if version not in known_revisions():
        raise SchemaTooNew(
            f"the store {masked} has schema revision {version}, newer than this "
            f"crossintercom knows (head {head}); upgrade crossintercom on this host"
        )
    raise SchemaOutdated(
        f"the store {masked} has schema revision {version}, older than {head}; "
        f"run `crossintercom db upgrade --store {masked}`"
    )


def _refuse_old_chain(conn: Connection, masked: str) -> None:
    from alembic.runtime.migration import MigrationContext

    revision = MigrationContext.configure(conn).get_current_revision()
    if revision in OLD_CHAIN:
        raise SchemaOutdated(
            f"the store {masked} is at revision {revision} of crossintercom 0.1.0; run "
            f"`crossintercom db upgrade` of version 0.1.0 first (to 0016), then this one's"
        )


def _run(url: str, action: str, revision: str | None = None) -> str | None:
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.util.exc import CommandError

    parsed = parse_store_url(url)
    engine = db.store_engine(parsed, must_exist=False)
    cfg = alembic_config()
    # An attribute, not an ini option: no %-interpolation of a password, no second engine.
    cfg.attributes[ENGINE_ATTRIBUTE] = engine
    cfg.attributes[REFRESH_ATTRIBUTE] = action == "upgrade"
    try:
        if action in ("upgrade", "downgrade"):
            with engine.connect() as conn:
                _refuse_old_chain(conn, parsed.masked)
        if action == "upgrade":
            command.upgrade(cfg, revision or "head")
        elif action == "downgrade":
            command.downgrade(cfg, revision or "base")
        elif action == "stamp":
            command.stamp(cfg, revision or "head", purge=True)
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except CommandError as exc:
        if "Can't locate revision" in str(exc):
            raise SchemaTooNew(
                f"the store {parsed.masked} has a schema newer than this crossintercom knows; "
                "upgrade crossintercom on this host"
            ) from exc
        raise StoreError(f"migration of {parsed.masked} failed: {exc}") from exc
    except SQLAlchemyError as exc:
        raise db.translate(parsed, exc) from exc
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> str | None:
    """Bring the store's schema to ``revision`` (head); returns the revision it is at."""
    return _run(url, "upgrade", revision)


def downgrade(url: str, revision: str) -> str | None:
    return _run(url, "downgrade", revision)


def current(url: str) -> str | None:
    """The store's schema revision, or None when it has none."""
    parsed = parse_store_url(url)
    if parsed.kind == "sqlite" and parsed.path is not None and not parsed.path.exists():
        # Reading must not create the file: check the path, report no schema.
        db.check_writable(parsed.path, parsed.masked, must_exist=False)
        return None
    return _run(url, "current")
