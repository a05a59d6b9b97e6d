"""The delivery path of a store without an async driver: each ``HotPath`` call is the blocking
``MailboxStore`` method in a worker thread (SQLite, and what the PostgreSQL hot path hands
back to its store: docs/storage.md, "The relay's hot path")."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

from crossintercom.storage.interface import (
    DEFAULT_MAX_PAYLOAD_CHARS,
    Ack,
    EnqueueResult,
    InboundRow,
    LateReceipt,
    MailboxStore,
    OutboundItem,
    ReceiptRow,
    StuckTransaction,
)


class ThreadHotPath:
    def __init__(self, store: MailboxStore) -> None:
        self.store = store

    async def enqueue(
        self, items: Sequence[OutboundItem], *, generation: int | None = None
    ) -> list[EnqueueResult]:
        return await asyncio.to_thread(self.store.enqueue, items, generation=generation)

    async def fetch_inbound(
        self,
        host_id: str,
        generation: int,
        *,
        limit: int = 500,
        session_ids: Collection[str] | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD_CHARS,
    ) -> list[InboundRow]:
        return await asyncio.to_thread(
            self.store.fetch_inbound,
            host_id,
            generation,
            limit=limit,
            session_ids=session_ids,
            max_payload=max_payload,
        )

    async def ack(self, host_id: str, generation: int, acks: Sequence[Ack]) -> int:
        return await asyncio.to_thread(self.store.ack, host_id, generation, acks)

    async def receipts(
        self, host_id: str, generation: int, *, limit: int = 500
    ) -> list[ReceiptRow]:
        return await asyncio.to_thread(self.store.receipts, host_id, generation, limit=limit)

    async def consume_receipts(
        self, host_id: str, generation: int, receipt_ids: Sequence[int]
    ) -> None:
        await asyncio.to_thread(self.store.consume_receipts, host_id, generation, receipt_ids)

    async def add_receipts(
        self, host_id: str, generation: int, receipts: Sequence[LateReceipt]
    ) -> int:
        return await asyncio.to_thread(self.store.add_receipts, host_id, generation, receipts)

    async def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        return await asyncio.to_thread(self.store.stuck_transactions, idle_s)

    async def aclose(self) -> None:
        """Nothing of its own to close: the store is its owner's."""
