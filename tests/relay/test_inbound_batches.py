"""The receiving side in batches (docs/perf-log/2026-12.md, "Cross-host throughput and catch-up"):
a fetch of queued rows goes to the broker as one ``inbound_batch`` frame per recipient, the
recipient saves them in order and once each, and a broker killed in the middle of a batch
loses and repeats nothing: the rows it did not answer for stay queued and are handed over
again, the inbox holding each message once."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

from crossintercom.models import Message, Peer, durable_session_id
from crossintercom.relay.inbound import INBOUND_BATCH
from crossintercom.storage import MailboxStore, OutboundItem, open_store
from crossintercom.storage.blocking import run
from crossintercom.tools.harness import BULK_SENDER
from tests.relay.conftest import Cluster, Host, Listener, wait_for

SINKS = ("sink0", "sink1")


def _queue(store: MailboxStore, sender_host: str, recipient: Host, n: int) -> dict[str, list[str]]:
    """``n`` messages queued in the store for the sinks on ``recipient``, alternating, in one
    enqueue (one transaction: seq order is list order), as a sending relay writes them.
    Returns each sink's message ids in their order."""
    sender = Peer(str(uuid.uuid4()), "planner", sender_host)
    items: list[OutboundItem] = []
    order: dict[str, list[str]] = {name: [] for name in SINKS}
    for i in range(n):
        name = SINKS[i % len(SINKS)]
        msg = Message(str(uuid.uuid4()), sender, to=f"{name}@{recipient.host_id}", text=f"m{i}")
        session = durable_session_id(recipient.host_id, name)
        order[name].append(msg.id)
        items.append(
            OutboundItem(
                msg.id,
                sender_host,
                recipient.host_id,
                session,
                msg.digest(),
                msg.to_dict(),
                msg.size(),
            )
        )
    results = run(store.enqueue(items))
    assert all(r.inserted and r.state == "queued" for r in results)
    return order


def _printed(listener: Listener) -> list[str]:
    return [o["id"] for o in list(listener.seen) if o.get("type") == "message"]


def _shows(listener: Listener, n: int) -> Callable[[], bool]:
    return lambda: len(_printed(listener)) >= n


def _nothing_queued(store: MailboxStore, host_id: str) -> bool:
    [gen] = [h.generation for h in run(store.hosts()) if h.host_id == host_id]
    return not run(store.fetch_inbound(host_id, gen, limit=1))


def _backlog(cluster: Cluster, n: int) -> tuple[Host, dict[str, Listener], dict[str, list[str]]]:
    """Hosts A and B, B's sinks listening with B's relay stopped and ``n`` rows queued for
    them; then B's relay is started."""
    # The per-sender rate limit lifted: the backlog is one sender's.
    a, b = cluster.up("A", "B", B=dict(BULK_SENDER))
    listeners = {name: b.listen(name) for name in SINKS}
    for name in SINKS:
        a.wait_sees(name, "B")
    b.stop_relay()
    store = run(open_store(cluster.store_url))
    try:
        order = _queue(store, a.host_id, b, n)
    finally:
        run(store.aclose())
    b.start_relay()
    return b, listeners, order


def _settled(
    cluster: Cluster, b: Host, listeners: dict[str, Listener], order: dict[str, list[str]]
) -> None:
    """Every message printed once, in its queue order, saved once, and no row left queued."""
    for name, lst in listeners.items():
        wait_for(_shows(lst, len(order[name])), 120, f"{name} to show all")
    store = run(open_store(cluster.store_url))
    try:
        wait_for(lambda: _nothing_queued(store, b.host_id), 60, "every row finished")
    finally:
        run(store.aclose())
    for name, lst in listeners.items():
        assert _printed(lst) == order[name]  # in order, each once
        held = b.inbox(name)
        assert set(held) == set(order[name]) and set(held.values()) == {1}


def test_a_full_batch_for_two_recipients_lands_in_order_once_each(cluster: Cluster) -> None:
    b, listeners, order = _backlog(cluster, INBOUND_BATCH)
    _settled(cluster, b, listeners, order)
    # The relay read them in one batch: one frame per recipient, not one per row.
    log = b.relay_log()
    assert "hand-over failed" not in log and "stays queued" not in log, log[-2000:]


def test_a_broker_killed_mid_batch_loses_and_repeats_nothing(cluster: Cluster) -> None:
    total = 4 * INBOUND_BATCH
    b, listeners, order = _backlog(cluster, total)
    first = listeners[SINKS[0]]
    # Killed once the first messages are shown and long before the last: a batch is in hand.
    wait_for(lambda: len(_printed(first)) > 0, 60, "the first message shown")
    assert b.kill_broker()
    shown_at_kill = sum(len(_printed(lst)) for lst in listeners.values())
    assert shown_at_kill < total
    _settled(cluster, b, listeners, order)
    printed = Counter(i for lst in listeners.values() for i in _printed(lst))
    assert sum(printed.values()) == total and set(printed.values()) == {1}
