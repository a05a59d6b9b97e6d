"""Batch writes in a constant number of statements, whatever the batch size, with the results
that handling the items one by one, in order, would give (tests/storage/test_batches.py).

Each function runs inside the caller's transaction; the caller commits and sends wake-ups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy import Connection

from crossintercom.errors import Code, StoreFenced
from crossintercom.models import DeliveryState, State
from crossintercom.storage import queries as q
from crossintercom.storage.interface import (
    Ack,
    EnqueueResult,
    LateReceipt,
    OutboundItem,
    StoreSettings,
)

_json = msgspec.json.Encoder()


def enqueue_batch(
    conn: Connection,
    dialect: str,
    items: Sequence[OutboundItem],
    limits: StoreSettings,
    now: datetime,
) -> tuple[list[EnqueueResult], set[str]]:
    """Insert the messages, read back the digests of those that already existed, insert the
    deliveries, read back the states of those that already existed. Returns one result per
    item, in order, and the recipient hosts that got a new delivery (to wake)."""
    woken: set[str] = set()
    expires = now + timedelta(seconds=limits.retention_s)
    results: list[EnqueueResult | None] = [None] * len(items)
    fitting: list[tuple[int, OutboundItem]] = []
    for i, item in enumerate(items):
        if item.size > limits.max_message_bytes:
            results[i] = EnqueueResult(
                item.message_id, item.recipient_session, State.REFUSED.value, False, Code.TOO_LARGE
            )
        else:
            fitting.append((i, item))
    if not fitting:
        return [r for r in results if r is not None], set()

    # The first item of an id in the batch is the one whose payload the row holds.
    first: dict[str, OutboundItem] = {}
    for _, item in fitting:
        first.setdefault(item.message_id, item)
    inserted_ids = set(
        conn.execute(
            q.insert_messages_if_absent(dialect),
            [
                {
                    "message_id": m.message_id,
                    "sender_host": m.sender_host,
                    "digest": m.digest,
                    "payload": m.payload,
                    "size": m.size,
                    "created": now,
                }
                for m in first.values()
            ],
        ).scalars()
    )
    digests = {mid: first[mid].digest for mid in inserted_ids}
    existing = [mid for mid in first if mid not in inserted_ids]
    if existing:
        digests.update(conn.execute(q.MESSAGE_DIGESTS, {"message_ids": existing}).all())

    wanted: dict[tuple[str, str], tuple[int, OutboundItem]] = {}
    for i, item in fitting:
        found = digests.get(item.message_id)
        if found is None:
            # The id exists but is not ours to see (another host's message, under per-host
            # row-level security): the id is taken.
            results[i] = EnqueueResult(
                item.message_id,
                item.recipient_session,
                State.REFUSED.value,
                False,
                Code.ID_CONFLICT,
            )
        elif found != item.digest:
            results[i] = EnqueueResult(
                item.message_id,
                item.recipient_session,
                State.REFUSED.value,
                False,
                Code.PAYLOAD_CONFLICT,
            )
        else:
            wanted.setdefault((item.message_id, item.recipient_session), (i, item))
    new_keys: set[tuple[str, str]] = set()
    if wanted:
        rows = conn.execute(
            q.insert_deliveries_if_absent(dialect),
            [
                {
                    "message_id": d.message_id,
                    "recipient_host": d.recipient_host,
                    "recipient_session": d.recipient_session,
                    "state": State.QUEUED.value,
                    "expires_at": expires,
                }
                for _, d in wanted.values()
            ],
        )
        new_keys = {(mid, session) for _seq, mid, session in rows}
    old_keys = [key for key in wanted if key not in new_keys]
    states: dict[tuple[str, str], DeliveryState] = {}
    if old_keys:
        states = {
            (mid, session): state
            for mid, session, state in conn.execute(
                q.delivery_states(dialect), q.key_params(dialect, old_keys)
            )
        }
    for i, item in fitting:
        if results[i] is not None:
            continue
        key = (item.message_id, item.recipient_session)
        if key in new_keys and wanted[key][0] == i:
            # Only the first item of a pair inserted it; a repeat in the batch did not.
            results[i] = EnqueueResult(*key, State.QUEUED.value, True, None)
            woken.add(item.recipient_host)
        else:
            results[i] = EnqueueResult(*key, states.get(key, State.QUEUED.value), False, None)
    return [r for r in results if r is not None], woken


@dataclass
class PgEnqueue:
    """One ``queries.pg_enqueue`` run: its parameters (None when no item fits the size limit),
    the results known before it (``too_large``), and which items it carries."""

    items: Sequence[OutboundItem]
    generation: int | None
    results: list[EnqueueResult | None]
    fitting: list[int]
    params: dict[str, Any] | None

    def finish(self, rows: Sequence[Any]) -> list[int] | None:
        """Fill the results from the statement's rows; the positions to run again in a new
        statement (see ``PostgresStore.enqueue``), or None when the generation was stale."""
        if self.generation is not None and rows and not rows[0][1]:
            return None
        batch = [self.items[i] for i in self.fitting]
        return _pg_results(batch, rows, self.results, self.fitting)

    def done(self) -> list[EnqueueResult]:
        return [r for r in self.results if r is not None]


def plan_pg_enqueue(
    items: Sequence[OutboundItem], limits: StoreSettings, now: datetime, generation: int | None
) -> PgEnqueue:
    """The parameters of ``queries.pg_enqueue`` for ``items`` (those over the size limit are
    refused here); ``PostgresStore.enqueue`` runs it."""
    results: list[EnqueueResult | None] = [None] * len(items)
    fitting: list[int] = []
    for i, item in enumerate(items):
        if item.size > limits.max_message_bytes:
            results[i] = EnqueueResult(
                item.message_id, item.recipient_session, State.REFUSED.value, False, Code.TOO_LARGE
            )
        else:
            fitting.append(i)
    if not fitting:
        return PgEnqueue(items, generation, results, fitting, None)
    batch = [items[i] for i in fitting]
    params = {
        "host_id": batch[0].sender_host,
        "generation": generation,
        "now": now,
        "expires": now + timedelta(seconds=limits.retention_s),
        "mids": [it.message_id for it in batch],
        "rhosts": [it.recipient_host for it in batch],
        "rsessions": [it.recipient_session for it in batch],
        "digests": [it.digest for it in batch],
        # One JSON array (queries.PG_ENQUEUE): a text[] of JSON texts costs the driver an
        # escape per quote of every payload.
        "payloads": _json.encode([it.payload for it in batch]).decode(),
        "sizes": [it.size for it in batch],
    }
    return PgEnqueue(items, generation, results, fitting, params)


def _pg_results(
    batch: Sequence[OutboundItem],
    rows: Sequence[Any],
    results: list[EnqueueResult | None],
    where: list[int],
) -> list[int]:
    """Fill ``results`` from ``pg_enqueue``'s rows; the positions to run again (see above)."""
    first_digest: dict[str, str] = {}
    first_of_pair: dict[tuple[str, str], int] = {}
    again: list[int] = []
    for k, (item, row) in enumerate(zip(batch, rows, strict=True)):
        _ord, _current, msg_new, old_digest, dlv_new, old_state, _woken = row
        key = (item.message_id, item.recipient_session)
        first_digest.setdefault(item.message_id, item.digest)
        digest = first_digest[item.message_id] if msg_new else old_digest
        if digest is None:
            # Not ours to see (another host's id under row-level security), or committed
            # while we waited: a new statement tells which.
            again.append(where[k])
            continue
        if digest != item.digest:
            code = Code.PAYLOAD_CONFLICT
            results[where[k]] = EnqueueResult(*key, State.REFUSED.value, False, code)
            continue
        first = first_of_pair.setdefault(key, k) == k
        if dlv_new and first:
            results[where[k]] = EnqueueResult(*key, State.QUEUED.value, True, None)
        elif old_state is not None or not first:
            results[where[k]] = EnqueueResult(*key, old_state or State.QUEUED.value, False, None)
        else:
            again.append(where[k])
    return again


# -- parameters of the other delivery-path statements (postgres.py) -----------------------------


def ack_params(
    host_id: str, generation: int, acks: Sequence[Ack], now: datetime
) -> dict[str, Any] | None:
    """``PG_ACK``'s parameters; None when there is nothing to ack."""
    # The first ack of a row wins, as it would one by one; the rest change nothing.
    first: dict[tuple[str, str], Ack] = {}
    for a in acks:
        first.setdefault((a.message_id, a.recipient_session), a)
    if not first:
        return None
    return {
        "host_id": host_id,
        "generation": generation,
        "finished": now,
        # One JSON array of rows, not a text[] per column: the driver dumps a text[] element
        # by element in Python (docs/perf-log/2026-12.md, "The hand-over's Python per message").
        "rows": _json.encode(
            [[a.message_id, a.recipient_session, a.outcome, a.code] for a in first.values()]
        ).decode(),
    }


def add_receipts_params(
    host_id: str, generation: int, receipts: Sequence[LateReceipt], now: datetime
) -> dict[str, Any] | None:
    """``PG_ADD_RECEIPTS``'s parameters; None when there is nothing to write."""
    if not receipts:
        return None
    return {
        "host_id": host_id,
        "generation": generation,
        "created": now,
        "rows": _json.encode(
            [
                (
                    r.message_id,
                    r.recipient_session,
                    r.sender_host,
                    r.sender_session,
                    r.outcome,
                    r.code,
                    r.note,
                )
                for r in receipts
            ]
        ).decode(),
    }


def stale_enqueue(items: Sequence[OutboundItem], generation: int | None) -> StoreFenced:
    sender = items[0].sender_host
    return StoreFenced(f"generation {generation} of host {sender!r} is stale; nothing written")
