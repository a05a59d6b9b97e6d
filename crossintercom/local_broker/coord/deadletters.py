"""Dead letters: what this host's sessions sent that never reached a recipient, kept on the
sending host for the retention period (docs/delivery.md#dead-letters).

A refusal (or a send that was not made) is known with the send's result; an expiry, a
recipient forgotten before collecting it, or a refusal by the recipient's host after queueing
comes later, as a receipt. To offer a resend then, the body of every send that was queued (the
only ones that can still fail) is kept for the retention in ``broker.sqlite``; one that was
delivered is never kept.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import msgspec

from crossintercom import protocol as p
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import Outcome, Receipt, SendResult

# What never reached its recipient: at once (refused, not sent) or later (receipts).
_DEAD_NOW = frozenset({Outcome.REFUSED, Outcome.NOT_SENT})
_DEAD_LATER = frozenset({Outcome.EXPIRED, Outcome.REFUSED})
_body = msgspec.json.Decoder(p.OutgoingBody)


class DeadLetterBook:
    def __init__(self, state: BrokerState, retention_s: float) -> None:
        self.db = state.db
        self.retention_s = retention_s

    def sent(self, sender_id: str, body: p.OutgoingBody, result: SendResult) -> None:
        """A send's result: its dead letters now, or its body kept while it may still fail."""
        encoded = msgspec.json.encode(body).decode()
        now = time.time()
        dead = [
            (r.recipient or body.to or "", r.outcome, r.code, r.message)
            for r in result.receipts or ()
            if r.outcome in _DEAD_NOW
        ]
        if not result.receipts and result.outcome in _DEAD_NOW:
            dead.append((body.to or "", result.outcome, result.code, result.message))
        for recipient, outcome, code, reason in dead:
            self._insert(body.id, recipient, sender_id, encoded, outcome, code, reason, now)
        queued = result.outcome is Outcome.QUEUED or any(
            r.outcome is Outcome.QUEUED for r in result.receipts or ()
        )
        if queued:
            self.db.execute(
                "INSERT OR IGNORE INTO sent_queued (message_id, sender, body, sent) "
                "VALUES (?, ?, ?, ?)",
                (body.id, sender_id, encoded, now),
            )

    def note(self, receipts: Iterable[Receipt]) -> None:
        """Receipts that say a queued message will never arrive."""
        for r in receipts:
            if r.outcome not in _DEAD_LATER:
                continue
            row = self.db.execute(
                "SELECT sender, body FROM sent_queued WHERE message_id = ?", (r.id,)
            ).fetchone()
            if row is not None:
                recipient = r.recipient or ""
                self._insert(r.id, recipient, row[0], row[1], r.outcome, r.code, r.message)

    def _insert(
        self,
        mid: str,
        recipient: str,
        sender: str,
        body: str,
        outcome: str,
        code: str | None,
        reason: str | None,
        at: float | None = None,
    ) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO dead_letters (message_id, recipient, sender, body, outcome, "
            "code, reason, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                mid,
                recipient,
                sender,
                body,
                outcome,
                code,
                reason,
                time.time() if at is None else at,
            ),
        )

    def of(self, sender_id: str | None) -> list[p.DeadLetter]:
        """A session's dead letters (None: every session's), oldest first."""
        cutoff = time.time() - self.retention_s
        self.db.execute("DELETE FROM dead_letters WHERE at < ?", (cutoff,))
        self.db.execute("DELETE FROM sent_queued WHERE sent < ?", (cutoff,))
        where, params = ("WHERE sender = ?", (sender_id,)) if sender_id else ("", ())
        rows = self.db.execute(
            "SELECT message_id, sender, recipient, outcome, at, body, code, reason, resent_as "
            f"FROM dead_letters {where} ORDER BY at",
            params,
        )
        out = []
        for mid, sender, recipient, outcome, at, body, code, reason, resent in rows:
            msg = _body.decode(body)
            to = msg.to or recipient
            out.append(
                p.DeadLetter(mid, sender, to, recipient, outcome, at, msg, code, reason, resent)
            )
        return out

    def count(self) -> int:
        """Dead letters within the retention not resent yet, of every sender on this host."""
        cutoff = time.time() - self.retention_s
        q = "SELECT count(*) FROM dead_letters WHERE at >= ? AND resent_as IS NULL"
        return int(self.db.execute(q, (cutoff,)).fetchone()[0])

    def resent(self, message_id: str, recipient: str, new_id: str) -> None:
        self.db.execute(
            "UPDATE dead_letters SET resent_as = ? WHERE message_id = ? AND recipient = ?",
            (new_id, message_id, recipient),
        )
