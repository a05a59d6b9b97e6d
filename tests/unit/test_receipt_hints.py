"""The sending relay's receipts (relay/receipts.py): a receipt answers the forward waiting for it
only from the host that forward went to, each receipt is passed on once whether it came in a
hint, a read or both, and the handled ones are consumed in one call; an acknowledgement's note
is passed on as its message, and only an acknowledgement's."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from crossintercom import protocol as p
from crossintercom.models import ACK_NOTE_CHARS
from crossintercom.relay.core import RelayCore
from crossintercom.relay.outbound import Outbound
from crossintercom.relay.receipts import Receipts
from crossintercom.storage import ReceiptRow


class _Relay:
    """What Receipts uses of a relay: no broker client, a store that records consumes."""

    host, generation, client = "A", 1, None

    def __init__(self) -> None:
        self.consumed: list[list[int]] = []
        self.store = self

    async def consume_receipts(self, host: str, generation: int, ids: list[int]) -> None:
        self.consumed.append(list(ids))

    def spawn(self, coro: Any) -> None:
        asyncio.get_running_loop().create_task(coro)


def row(rid: int, host: str, mid: str = "m1") -> ReceiptRow:
    return ReceiptRow(rid, mid, "s1", host, "delivered", None)


def test_a_receipt_answers_only_from_the_forwards_host() -> None:
    async def run() -> None:
        relay = _Relay()
        outbound = Outbound(cast(RelayCore, relay))
        receipts = Receipts(cast(RelayCore, relay), outbound)
        fut: asyncio.Future[ReceiptRow] = asyncio.get_running_loop().create_future()
        outbound.receipt_waits[("m1", "s1")] = fut
        outbound.wait_hosts[("m1", "s1")] = "B"

        receipts.take([row(1, "C")])  # another host claims the receipt: ignored
        assert not fut.done()
        receipts.take([row(2, "B")])
        assert fut.done() and fut.result().id == 2
        receipts.take([row(2, "B"), row(1, "C")])  # a read finding them again: skipped
        await receipts.consume()
        assert relay.consumed == [[1, 2]]
        await receipts.consume()  # nothing left to delete
        assert relay.consumed == [[1, 2]]

    asyncio.run(run())


def test_only_an_acknowledgement_carries_its_note_and_at_most_a_notes_length() -> None:
    async def run() -> None:
        relay = _Relay()
        posted: list[Any] = []
        relay.client = cast(Any, type("Client", (), {"post": staticmethod(posted.append)}))
        outbound = Outbound(cast(RelayCore, relay))
        receipts = Receipts(cast(RelayCore, relay), outbound)
        rows = [
            ReceiptRow(1, "m1", "s1", "B", "acknowledged", None, "bs", "done"),
            ReceiptRow(2, "m2", "s1", "B", "shown", None, "bs", "not on a shown one"),
            ReceiptRow(3, "m3", "s1", "B", "acknowledged", None, "bs", "x" * 5000),
            ReceiptRow(4, "m4", "s1", "B", "acknowledged", None, "bs", cast(str, 42)),
        ]
        receipts.take(rows)
        [frame] = posted
        assert isinstance(frame, p.RemoteReceipt)
        got = {r.id: r.message for r in frame.receipts}
        assert got == {"m1": "done", "m2": None, "m3": "x" * ACK_NOTE_CHARS, "m4": None}

    asyncio.run(run())
