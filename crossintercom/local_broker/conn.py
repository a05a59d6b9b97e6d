"""One client connection as the broker sees it."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from crossintercom import protocol as p
from crossintercom.local_broker.outcomes import AckResult

log = logging.getLogger(__name__)

# What a peer that does not read may leave queued for it, in multiples of the frame limit: past
# that it is disconnected, so a client that never reads cannot grow the broker without bound
# (docs/reliability.md, "Memory under socket hostility").
WRITE_BACKLOG_FRAMES = 2


class Conn:
    """A connection acts for at most one session; ``acks`` waits on its acknowledgements."""

    _ids = itertools.count(1)

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_backlog: int = WRITE_BACKLOG_FRAMES * 8 * 1024 * 1024,
    ) -> None:
        self.cid = next(self._ids)
        self.max_backlog = max_backlog
        self.reader = reader
        self.writer = writer
        self.out = p.Coalescer(writer)
        self.session_id: str | None = None
        self.owner = False
        self.control = False
        self.closed = False
        # message id (or receipt key) -> future resolved by the ack (None) or its refusal code.
        self.acks: dict[str, asyncio.Future[AckResult]] = {}

    def write(self, frame: p.BrokerFrame | p.ToRelayFrame | Any) -> bool:
        """Queue a frame; False if the connection can no longer be written."""
        return self.write_many((frame,))

    def write_many(self, frames: Sequence[p.BrokerFrame | p.ToRelayFrame | Any]) -> bool:
        """Queue frames in one write; False if the connection can no longer be written."""
        if self.closed or self.writer.is_closing():
            return False
        transport = self.writer.transport
        if transport.get_write_buffer_size() + self.out.held_bytes > self.max_backlog:
            # The peer stopped reading: drop it (as a failed write would) rather than queue on.
            log.warning(
                "connection %d dropped: its peer is not reading (%d bytes queued)",
                self.cid,
                transport.get_write_buffer_size(),
            )
            # abort(): the read loop then ends and the broker retires this connection as usual.
            transport.abort()
            return False
        try:
            self.out.write(b"".join(p.encode(f) for f in frames))
        except (OSError, RuntimeError):
            return False
        return True

    def expect_ack(self, key: str) -> asyncio.Future[AckResult]:
        """The future a coming ``ack`` for ``key`` resolves (one per key at a time)."""
        fut = self.acks.get(key)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            self.acks[key] = fut
        return fut
