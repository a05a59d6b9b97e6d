"""A rogue writer: rows put straight into the shared store, as a host with database access (or
a stray writer of the SQLite file) could, bypassing every check a relay makes on its way out."""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import create_engine, select
from sqlalchemy.engine import make_url

from crossintercom.storage.tables import deliveries
from crossintercom.tools.chaos.rogue import inject_rows, rogue_message


class Rogue:
    def __init__(self, store_url: str) -> None:
        self.url = store_url
        self.engine = create_engine(store_url)

    def close(self) -> None:
        self.engine.dispose()

    def insert(
        self,
        rows: list[tuple[str, Any]],
        *,
        sender_host: str,
        recipient_host: str,
        recipient_session: str,
    ) -> None:
        """(message id, payload) pairs, one message and one queued delivery each, in order."""
        inject_rows(
            self.url,
            rows,
            sender_host=sender_host,
            recipient_host=recipient_host,
            recipient_session=recipient_session,
        )

    def insert_raw_sqlite_payload(
        self, mid: str, text: str, *, sender_host: str, recipient_host: str, session: str
    ) -> None:
        """A payload that is not JSON at all (only SQLite lets one in: its JSON is TEXT)."""
        self.insert(
            [(mid, {})],
            sender_host=sender_host,
            recipient_host=recipient_host,
            recipient_session=session,
        )
        db = sqlite3.connect(str(make_url(self.url).database), timeout=30)
        try:
            with db:
                db.execute("UPDATE messages SET payload = ? WHERE message_id = ?", (text, mid))
        finally:
            db.close()

    def states(self, ids: list[str]) -> dict[str, tuple[str, str | None]]:
        with self.engine.connect() as conn:
            q = select(deliveries.c.message_id, deliveries.c.state, deliveries.c.reason).where(
                deliveries.c.message_id.in_(ids)
            )
            return {mid: (state, reason) for mid, state, reason in conn.execute(q)}


# A well-formed message payload (what a relay would write), fields overridable.
message = rogue_message
