"""Alembic, driven from code: the scripts ship inside the package, no alembic.ini needed."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from crossintercom.errors import SchemaTooNew, StoreError
from crossintercom.storage.urls import StoreURL, parse_store_url


def script_location() -> str:
    return str(Path(str(resources.files("crossintercom"))) / "alembic")


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", script_location())
    # Handed to env.py as an attribute, not an ini option: no %-interpolation of passwords.
    cfg.attributes["store_url"] = url
    return cfg


@cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    head = _scripts().get_current_head()
    assert head is not None
    return head


def known_revisions() -> set[str]:
    return {rev.revision for rev in _scripts().walk_revisions()}


def _engine(parsed: StoreURL) -> Engine:
    if parsed.kind == "sqlite":
        from crossintercom.storage.sqlite import check_writable, sqlite_engine

        assert parsed.path is not None
        check_writable(parsed.path, parsed.masked, must_exist=False)
        return sqlite_engine(parsed)
    from crossintercom.storage.postgres import PostgresStore

    # Reuse the backend's engine settings and its error wording.
    return PostgresStore(parsed).engine


def _fail(parsed: StoreURL, exc: SQLAlchemyError) -> StoreError:
    if parsed.kind == "postgres":
        from crossintercom.storage.postgres import PostgresStore

        store = PostgresStore.__new__(PostgresStore)
        store.url_masked = parsed.masked
        return store._unavailable(exc)
    from crossintercom.storage.sqlstore import one_line

    return StoreError(f"store {parsed.masked} failed: {one_line(exc)}")


def _run(url: str, action: str, revision: str | None = None) -> str | None:
    parsed = parse_store_url(url)
    engine = _engine(parsed)
    cfg = alembic_config(url)
    cfg.attributes["engine"] = engine
    try:
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
        raise _fail(parsed, exc) from exc
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
        from crossintercom.storage.sqlite import check_writable

        check_writable(parsed.path, parsed.masked, must_exist=False)
        return None
    return _run(url, "current")
