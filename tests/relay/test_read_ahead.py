"""The inbound read ahead (docs/perf-log/2026-12.md, "Catch-up: the read ahead and the stored text
passed through"): the next batch is read while one is handed over, its statement leaving out
the rows in flight. Run in one process against a real store, with a broker stand-in that
decodes each frame as the broker does: every row is handed over once, none is skipped, each
recipient's rows go in queue order, also when a hand-over fails in the middle."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Any, cast

import msgspec

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.models import Message, Outcome, Peer, Receipt, SessionInfo, durable_session_id
from crossintercom.relay.core import RelayCore
from crossintercom.relay.inbound import INBOUND_BATCH, Inbound
from crossintercom.relay.outbound import Outbound
from crossintercom.storage import InboundRow, MailboxStore, OutboundItem, open_store

HOST, SENDER_HOST = "ra-recv", "ra-send"
SINKS = ("sink0", "sink1")


class Broker:
    """Stands in for the broker on the relay's link: decodes each ``inbound_batch`` as the
    broker does and answers ``delivered`` for every message, after a turn of the loop (so a
    read ahead runs while it waits). ``fail``: the request numbers to fail instead."""

    def __init__(self, fail: Collection[int] = ()) -> None:
        self.connected = asyncio.Event()
        self.connected.set()
        self.handed: dict[str, list[str]] = {s: [] for s in SINKS}
        self.requests = 0
        self.in_request = 0
        self.fail = set(fail)

    async def request(self, frame: msgspec.Struct) -> p.BrokerFrame:
        self.requests += 1
        n = self.requests
        decoded = p.decode_client_frame(p.encode(frame)[p.HEADER.size :])
        assert isinstance(decoded, p.InboundBatch)
        self.in_request += 1
        try:
            await asyncio.sleep(0.005)
        finally:
            self.in_request -= 1
        if n in self.fail:
            raise ConnectionError("the broker went away")
        [name] = [s for s in SINKS if durable_session_id(HOST, s) == decoded.recipient]
        self.handed[name] += [m.id for m in decoded.messages]
        receipts = [Receipt(m.id, Outcome.DELIVERED, decoded.recipient) for m in decoded.messages]
        return p.InboundResult(decoded.request_id, receipts)


class Recorder:
    """The store, with every ``fetch_inbound`` recorded: what it skipped, what it returned,
    and whether a hand-over ran while it did."""

    def __init__(self, store: MailboxStore, broker: Broker) -> None:
        self.store = store
        self.broker = broker
        self.reads: list[tuple[frozenset[int], list[InboundRow], bool]] = []
        self.generation = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def fetch_inbound(self, *args: Any, **kw: Any) -> list[InboundRow]:
        started = self.broker.requests
        rows = await self.store.fetch_inbound(*args, **kw)
        overlapping = self.broker.requests > started or self.broker.in_request > 0
        self.reads.append((frozenset(kw.get("skip_seqs", ())), rows, overlapping))
        return rows


def _queue(n: int) -> tuple[dict[str, list[str]], list[OutboundItem]]:
    """``n`` messages for the two sinks, alternating: each sink's ids in queue order, and the
    items, as a sending relay writes them."""
    sender = Peer(str(uuid.uuid4()), "planner", SENDER_HOST)
    order: dict[str, list[str]] = {s: [] for s in SINKS}
    items = []
    for i in range(n):
        name = SINKS[i % 2]
        msg = Message(str(uuid.uuid4()), sender, to=f"{name}@{HOST}", text=f"m{i}")
        order[name].append(msg.id)
        session = durable_session_id(HOST, name)
        items.append(
            OutboundItem(
                msg.id, SENDER_HOST, HOST, session, msg.digest(), msg.to_dict(), msg.size()
            )
        )
    return order, items


async def _drain(
    url: str, tmp: Path, n: int, fail: Collection[int] = ()
) -> tuple[dict[str, list[str]], Broker, Recorder, MailboxStore]:
    store = await open_store(url)
    order, items = _queue(n)
    for k in range(0, len(items), 1000):
        await store.enqueue(items[k : k + 1000])
    broker = Broker(fail)
    recorder = Recorder(store, broker)
    relay = RelayCore(Settings(home=tmp, host_id=HOST), cast(MailboxStore, recorder))
    relay.generation = recorder.generation = await store.claim_host(HOST)
    relay.local_sessions = [
        SessionInfo(durable_session_id(HOST, s), HOST, s, durable=True) for s in SINKS
    ]
    relay.client = cast(Any, broker)
    inbound = Inbound(relay, cast(Outbound, None))
    # As the inbound loop does on each wake-up, until a pass finds nothing (a failed
    # hand-over leaves rows queued for the next pass).
    for _ in range(10):
        before = sum(len(v) for v in broker.handed.values())
        await inbound._fetch_all()
        if sum(len(v) for v in broker.handed.values()) == before:
            break
    return order, broker, recorder, store


def _check_once_in_order(order: dict[str, list[str]], broker: Broker) -> None:
    for name in SINKS:
        assert broker.handed[name] == order[name]  # each once, none skipped, in queue order


def test_read_ahead_hands_every_row_once_in_order(store_url: str, tmp_path: Path) -> None:
    n = 3 * INBOUND_BATCH + 137

    async def main() -> None:
        order, broker, recorder, store = await _drain(store_url, tmp_path, n)
        try:
            _check_once_in_order(order, broker)
            assert not await store.fetch_inbound(HOST, recorder.generation, limit=1)
        finally:
            await store.aclose()
        # Each read returned none of the rows it was told to skip, and after the first, the
        # reads ran while a batch was being handed over, skipping that batch.
        for skip, rows, _ in recorder.reads:
            assert not skip & {r.seq for r in rows}
        overlapped = [skip for skip, _, during in recorder.reads if during]
        assert len(overlapped) >= 3 and all(len(s) >= INBOUND_BATCH for s in overlapped)
        # No row was read by two reads whose rows were both handed over: the reads returned
        # n rows in all, plus only the empty read that ends the pass.
        assert sum(len(rows) for _, rows, _ in recorder.reads) == n

    asyncio.run(main())


def test_a_failed_hand_over_holds_back_the_read_ahead(store_url: str, tmp_path: Path) -> None:
    """The second frame fails (the first batch's second recipient): the batch read ahead is
    not handed over, the failed rows are read again without being skipped, and nothing of
    that recipient overtakes them."""
    n = 3 * INBOUND_BATCH

    async def main() -> None:
        order, broker, recorder, store = await _drain(store_url, tmp_path, n, fail={2})
        try:
            _check_once_in_order(order, broker)
            assert not await store.fetch_inbound(HOST, recorder.generation, limit=1)
        finally:
            await store.aclose()

    asyncio.run(main())
