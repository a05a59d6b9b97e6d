"""Alembic environment for the shared store. Two ways in, one way of connecting
(``storage.engine``):

- from code (``storage/migrate.py``, behind ``crossintercom db upgrade``): the engine is handed
  over in ``config.attributes``; errors propagate for ``migrate`` to translate;
- from the ``alembic`` command line in a checkout (the root ``alembic.ini``): the store is
  ``-x store=URL``, else ``$CROSSINTERCOM_STORE``, else alembic.ini's ``sqlalchemy.url``;
  errors are printed as one ``FAILED:`` line, password masked.

Online only: there is no offline (SQL script) mode.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from alembic.util.exc import CommandError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from crossintercom.config import ENV_STORE
from crossintercom.errors import StoreError
from crossintercom.storage import engine as db
from crossintercom.storage import queries as q
from crossintercom.storage import schema
from crossintercom.storage.migrate import ENGINE_ATTRIBUTE, REFRESH_ATTRIBUTE
from crossintercom.storage.tables import include_name, metadata
from crossintercom.storage.urls import parse_store_url

config = context.config


def store_url() -> str:
    """The store the command line names: ``-x store=URL``, the environment, the ini file."""
    x_args = dict(arg.partition("=")[::2] for arg in context.get_x_argument())
    url = (
        x_args.get("store") or os.environ.get(ENV_STORE) or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise CommandError(
            f"no store given: pass -x store=URL, set {ENV_STORE}, "
            "or set sqlalchemy.url in alembic.ini"
        )
    return url


def run_migrations(engine: Engine) -> None:
    with engine.connect() as connection:
        postgres = connection.dialect.name == "postgresql"
        if postgres:
            # One upgrader at a time; a second waits, then finds nothing left to do.
            connection.execute(q.PG_ADVISORY_LOCK, {"key": q.PG_MIGRATION_LOCK_KEY})
            connection.commit()
        try:
            context.configure(
                connection=connection,
                target_metadata=metadata,
                # SQLite cannot ALTER most things; batch mode copies the table instead.
                render_as_batch=connection.dialect.name == "sqlite",
                transaction_per_migration=False,
                # The archive's full-text index is the migration's alone (tables.py says why).
                include_name=include_name,
            )
            with context.begin_transaction():
                context.run_migrations()
                if config.attributes.get(REFRESH_ATTRIBUTE):
                    # The lists of codes and outcomes the policies take (storage/schema).
                    schema.refresh(connection)
        finally:
            if postgres:
                connection.rollback()
                connection.execute(q.PG_ADVISORY_UNLOCK, {"key": q.PG_MIGRATION_LOCK_KEY})
                connection.commit()


def run_from_command_line() -> None:
    if config.config_file_name is not None:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    try:
        parsed = parse_store_url(store_url())
        engine = db.store_engine(parsed, must_exist=False)
    except StoreError as exc:
        raise CommandError(exc.message) from exc
    try:
        run_migrations(engine)
    except SQLAlchemyError as exc:
        raise CommandError(db.translate(parsed, exc).message) from exc
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise CommandError(
        "offline (SQL script) migrations are not supported; run `crossintercom db upgrade` "
        "or `alembic upgrade` against the store"
    )
handed_over: Engine | None = config.attributes.get(ENGINE_ATTRIBUTE)
if handed_over is not None:
    run_migrations(handed_over)
else:
    run_from_command_line()
