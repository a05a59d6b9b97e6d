"""Batch writes in a constant number of statements, whatever the batch size, with the results
that handling the items one by one, in order, would give (tests/storage/test_batches.py).

Each function runs inside the caller's transaction; the caller commits and sends wake-ups.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import Connection

from crossintercom.errors import Code, StoreFenced
from crossintercom.models import DeliveryState, State
from crossintercom.storage import queries as q
from crossintercom.storage.interface import EnqueueResult, OutboundItem, StoreSettings


def refuse_too_large(
    items: Sequence[OutboundItem], limits: StoreSettings
) -> tuple[list[EnqueueResult | None], list[int]]:
    """One result per item, ``too_large`` for those over the size limit (nothing written) and
    None for the others, whose positions come second."""
    results: list[EnqueueResult | None] = [None] * len(items)
    fitting: list[int] = []
    for i, item in enumerate(items):
        if item.size > limits.max_message_bytes:
            results[i] = EnqueueResult(
                item.message_id, item.recipient_session, State.REFUSED.value, False, Code.TOO_LARGE
            )
        else:
            fitting.append(i)
    return results, fitting


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
    results, fits = refuse_too_large(items, limits)
    fitting = [(i, items[i]) for i in fits]
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


def stale_enqueue(items: Sequence[OutboundItem], generation: int | None) -> StoreFenced:
    sender = items[0].sender_host
    return StoreFenced(f"generation {generation} of host {sender!r} is stale; nothing written")
