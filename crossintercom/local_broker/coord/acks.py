"""Messages sent with an acknowledgement request, kept on the sender's host until acknowledged
and for the retention after (docs/delivery.md#acknowledgement).

A table of its own in ``broker.sqlite``: written when a send with ``ack_required`` was
delivered or queued, marked when an ``acknowledged`` receipt for it passes through this broker
(from a session of this host, or from another host's relay), read by ``acks --sent``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from crossintercom import protocol as p
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import Outcome, Receipt


class AckBook:
    def __init__(self, state: BrokerState, retention_s: float) -> None:
        self.db = state.db
        self.retention_s = retention_s

    def expect(self, sender_id: str, body: p.OutgoingBody) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO ack_waits (message_id, sender, recipient, sent, ack_by) "
            "VALUES (?, ?, ?, ?, ?)",
            (body.id, sender_id, body.to or "(reply)", time.time(), body.ack_by),
        )

    def note(self, receipts: Iterable[Receipt]) -> None:
        """Mark the waits that ``acknowledged`` receipts answer (the first one counts)."""
        rows = [
            (time.time(), (r.host and f"{r.recipient}@{r.host}") or r.recipient, r.message, r.id)
            for r in receipts
            if r.outcome is Outcome.ACKNOWLEDGED
        ]
        if rows:
            self.db.executemany(
                "UPDATE ack_waits SET acked = ?, acked_by = ?, note = ? "
                "WHERE message_id = ? AND acked IS NULL",
                rows,
            )

    def of(self, sender_id: str) -> list[p.AckWait]:
        self.db.execute("DELETE FROM ack_waits WHERE sent < ?", (time.time() - self.retention_s,))
        cur = self.db.execute(
            "SELECT message_id, recipient, sent, ack_by, acked, acked_by, note FROM ack_waits "
            "WHERE sender = ? ORDER BY sent",
            (sender_id,),
        )
        return [p.AckWait(*row) for row in cur]
