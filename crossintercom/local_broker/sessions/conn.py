"""One client connection as the broker sees it."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from enum import Enum, auto
from typing import Any, Final, Literal

from crossintercom import protocol as p
from crossintercom.codes import Code

log = logging.getLogger(__name__)

# What a peer that does not read may leave queued for it, in multiples of the frame limit: past
# that it is disconnected, so a client that never reads cannot grow the broker without bound
# (docs/reliability.md, "Memory under socket hostility").
WRITE_BACKLOG_FRAMES = 2
# Pushes' ack deadlines are swept this many times per timeout, not timed one by one: a push
# times out at most a tenth of its timeout late (docs/perf-log/2026-12.md, "The hand-over's
# Python per message").
SWEEPS_PER_TIMEOUT: Final = 10


class Push(Enum):
    """What a push to a recipient's connection came to when its ack carried no refusal code.

    Never sent and never stored, so not codes: ``Delivery.push`` answers one of these or the
    code the ack refused with (``Code.SAVE_FAILED``: the client could not save it)."""

    ACKED = auto()
    OFFLINE = auto()  # no live owner: nothing was pushed
    CONNECTION_LOST = auto()
    TIMEOUT = auto()  # written, but not acknowledged in time


# A pending ack resolves to None (acknowledged), the refusal code it carried, or a lost
# connection (the broker retires it).
AckResult = str | Literal[Push.CONNECTION_LOST, Push.TIMEOUT] | None


class Conn:
    """A connection acts for at most one session; ``acks`` waits on its acknowledgements."""

    _ids = itertools.count(1)

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame: int = p.DEFAULT_MAX_FRAME,
    ) -> None:
        self.cid = next(self._ids)
        self.max_frame = max_frame
        self.base_backlog = self.max_backlog = WRITE_BACKLOG_FRAMES * max_frame
        self.reader = reader
        self.writer = writer
        self.out = p.Coalescer(writer)
        self.session_id: str | None = None
        self.owner = False
        self.control = False
        self.closed = False
        # message id (or receipt key) -> future resolved by the ack (None) or its refusal code.
        self.acks: dict[str, asyncio.Future[AckResult]] = {}
        # (deadline, key, future) in the order the pushes were written (one timeout for all).
        self._due: deque[tuple[float, str, asyncio.Future[AckResult]]] = deque()
        self._sweep_at: asyncio.TimerHandle | None = None

    def make_room(self, extra: int) -> None:
        """Let ``extra`` bytes more wait unread before the peer counts as not reading (a
        backlog handed over in one go); 0 gives back the usual bound."""
        self.max_backlog = self.base_backlog + extra

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
                transport.get_write_buffer_size() + self.out.held_bytes,
            )
            # abort(): the read loop then ends and the broker retires this connection as usual.
            transport.abort()
            return False
        try:
            self.out.write(b"".join(self._encode(f) for f in frames))
        except (OSError, RuntimeError):
            return False
        return True

    def _encode(self, frame: Any) -> bytes:
        """``frame`` on the wire; an answer the peer could not read (over its frame limit: a
        list of every host's sessions, say) goes as ``too_large`` instead, for a frame over
        the limit would drop the connection (docs/protocol.md)."""
        data = p.encode(frame)
        size = len(data) - p.HEADER.size
        if size <= self.max_frame:  # nearly every frame: one comparison
            return data
        request_id = getattr(frame, "request_id", None)
        if request_id is None:
            return data
        why = f"the answer is {size} bytes, over the {self.max_frame}-byte frame a client reads"
        return p.encode(p.Error(Code.TOO_LARGE, why, request_id))

    def expect_ack(self, key: str, timeout: float | None = None) -> asyncio.Future[AckResult]:
        """The future a coming ``ack`` for ``key`` resolves (one per key at a time); with
        ``timeout`` (the same on every call) resolved ``Push.TIMEOUT`` and forgotten once that
        passes without one."""
        fut = self.acks.get(key)
        loop = asyncio.get_running_loop()
        if fut is None or fut.done():
            fut = loop.create_future()
            self.acks[key] = fut
        if timeout is not None:
            self._due.append((loop.time() + timeout, key, fut))
            if self._sweep_at is None:
                self._sweep_at = loop.call_later(timeout, self._sweep, timeout)
        return fut

    def _sweep(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = self._due
        while due and due[0][0] <= now:
            _, key, fut = due.popleft()
            if not fut.done():  # written, but not acknowledged in time
                if self.acks.get(key) is fut:
                    del self.acks[key]
                fut.set_result(Push.TIMEOUT)
        self._sweep_at = None
        if due:
            at = max(due[0][0], now + timeout / SWEEPS_PER_TIMEOUT)
            self._sweep_at = loop.call_at(at, self._sweep, timeout)


# A frame's handler, given the connection it came on and the frame (the broker's table).
Handler = Callable[[Conn, Any], Coroutine[Any, Any, None]]
