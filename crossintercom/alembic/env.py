"""Alembic environment for the shared store; configured from code (see storage/migrate.py)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from crossintercom.storage import queries as q
from crossintercom.storage.tables import metadata

config = context.config


def run_migrations_online() -> None:
    engine: Engine = config.attributes["engine"]
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
            )
            with context.begin_transaction():
                context.run_migrations()
        finally:
            if postgres:
                connection.rollback()
                connection.execute(q.PG_ADVISORY_UNLOCK, {"key": q.PG_MIGRATION_LOCK_KEY})
                connection.commit()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run `db upgrade`")
run_migrations_online()
