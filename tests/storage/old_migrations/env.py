"""Alembic environment for the old revision chain (0001 to 0016 of version 0.1.0), kept only to
build stores as that version left them: the engine comes in ``config.attributes``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

engine: Engine = context.config.attributes["engine"]
with engine.connect() as connection:
    context.configure(
        connection=connection,
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()
