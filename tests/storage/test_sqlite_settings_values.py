"""Settings a writer of a SQLite file stored out of shape are taken at their defaults, never a
failure of every read (``--5``, more digits than a number converts) or of every enqueue (a
retention past the year 9999): docs/storage.md, "Delivery states"."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.engine import make_url

from crossintercom.storage import StoreSettings, open_store
from crossintercom.storage.blocking import run


@pytest.mark.parametrize(
    "stored",
    ["'--5'", "'" + "9" * 5000 + "'", "9000000000000000000", "-7", "2147483648"],
    ids=["double-minus", "5000-digits", "int64", "negative", "past-int32"],
)
def test_a_setting_out_of_shape_is_its_default(sqlite_url: str, stored: str) -> None:
    conn = sqlite3.connect(str(make_url(sqlite_url).database))
    with conn:
        conn.execute(f"UPDATE settings SET retention_s = {stored}, max_message_bytes = {stored}")
    conn.close()
    store = run(open_store(sqlite_url))
    try:
        assert run(store.settings()) == StoreSettings()
    finally:
        run(store.aclose())
