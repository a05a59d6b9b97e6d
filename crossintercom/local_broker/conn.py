"""One client connection as the broker sees it."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from crossintercom import protocol as p


class Conn:
    """A connection acts for at most one session; ``acks`` waits on its acknowledgements."""

    _ids = itertools.count(1)

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.cid = next(self._ids)
        self.reader = reader
        self.writer = writer
        self.session_id: str | None = None
        self.owner = False
        self.control = False
        self.closed = False
        # message id (or receipt key) -> future resolved by the ack (None) or its refusal code.
        self.acks: dict[str, asyncio.Future[str | None]] = {}

    def write(self, frame: p.BrokerFrame | p.ToRelayFrame | Any) -> bool:
        """Queue a frame; False if the connection can no longer be written."""
        if self.closed or self.writer.is_closing():
            return False
        try:
            self.writer.write(p.encode(frame))
        except (OSError, RuntimeError):
            return False
        return True

    def expect_ack(self, key: str) -> asyncio.Future[str | None]:
        """The future a coming ``ack`` for ``key`` resolves (one per key at a time)."""
        fut = self.acks.get(key)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            self.acks[key] = fut
        return fut
