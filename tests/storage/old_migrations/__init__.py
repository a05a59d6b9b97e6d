"""The store's revisions as version 0.1.0 shipped them (0001 to 0016), to build a store at the
old head: the baseline revision must equal it, and ``db upgrade`` must carry it over."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from crossintercom.storage import engine as db
from crossintercom.storage.urls import parse_store_url

HERE = Path(__file__).parent
OLD_HEAD = "0016"


def old_upgrade(url: str, revision: str = OLD_HEAD) -> None:
    """Bring the store at ``url`` to ``revision`` of the old chain, as 0.1.0's upgrade did."""
    engine = db.store_engine(parse_store_url(url), must_exist=False)
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.attributes["engine"] = engine
    try:
        command.upgrade(cfg, revision)
    finally:
        engine.dispose()
