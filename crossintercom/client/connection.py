"""One connection to the local broker: framing, request/response correlation, the read loop.

Frames that answer a request resolve its future by ``request_id``; a late answer to a request
nobody waits for any more is dropped. Everything else (deliveries, notices, the relay link's
frames) goes to the ``on_frame`` callback of the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec

from crossintercom import protocol as p
from crossintercom.client.gateway_link import open_gateway
from crossintercom.config import Settings
from crossintercom.errors import (
    BrokerUnavailable,
    Code,
    CrossintercomError,
    Disconnected,
    RemoteError,
)
from crossintercom.local_broker.process.spawn import ensure_broker
from crossintercom.runtime import check_socket_path, socket_address

log = logging.getLogger(__name__)

F = TypeVar("F", bound=p.BrokerFrame)

# How long a frame posted for later waits for a request to ride with (``post_later``).
LATER_S = 0.05


def expect(frame: p.BrokerFrame, kind: type[F]) -> F:
    """The answer a request must get; another frame type is a protocol error."""
    if not isinstance(frame, kind):
        raise RemoteError(
            Code.BAD_FIELD, f"the broker answered {type(frame).__name__}, not {kind.__name__}"
        )
    return frame


class BrokerConnection:
    def __init__(
        self,
        settings: Settings,
        on_frame: Callable[[p.FromBroker], None],
        on_lost: Callable[[], None],
    ) -> None:
        self.settings = settings
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._reader: asyncio.StreamReader | None = None
        self._writer: p.FrameWriter | None = None
        self._out: p.Coalescer | None = None  # set with _writer
        self.read_task: asyncio.Task[None] | None = None
        self._next_rid = 1
        self._requests: dict[int, asyncio.Future[p.BrokerFrame]] = {}
        self._later: list[bytes] = []
        self._later_timer: asyncio.TimerHandle | None = None

    @property
    def open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self, *, spawn: bool) -> None:
        limit = self.settings.max_frame_bytes + 1024
        writer: p.FrameWriter
        if self.settings.gateway_url:
            # The same frames, to the gateway host's broker (docs/agents.md#through-a-gateway).
            reader, writer = await open_gateway(self.settings, limit)
        else:
            reader, writer = await self._open_socket(spawn, limit)
        self._reader, self._writer = reader, writer
        self._out = p.Coalescer(writer)
        self.read_task = asyncio.get_running_loop().create_task(self._read_loop(reader))

    async def _open_socket(
        self, spawn: bool, limit: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        check_socket_path(self.settings.socket_path)
        if spawn:
            await asyncio.to_thread(ensure_broker, self.settings)
        try:
            with socket_address(self.settings.socket_path) as address:
                return await asyncio.open_unix_connection(address, limit=limit)
        except OSError as exc:
            raise BrokerUnavailable(
                f"cannot reach the broker at {self.settings.socket_path}: {exc.strerror}"
            ) from None

    def drop(self) -> p.FrameWriter | None:
        """Close the socket and fail every request waiting on it; returns the old writer."""
        writer, self._writer, self._reader = self._writer, None, None
        out, self._out = self._out, None
        if writer is not None and out is not None:
            later = self._take_later()  # a closing client's last confirms
            if later and not writer.is_closing():
                with contextlib.suppress(Exception):
                    out.write(later)
            out.flush()
            writer.close()
        for fut in self._requests.values():
            if not fut.done():
                fut.set_exception(Disconnected("the connection to the broker was lost"))
        self._requests.clear()
        return writer

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                body = await p.read_frame(reader, self.settings.max_frame_bytes)
                if body is None:
                    break
                self._dispatch(p.decode_broker_frame(body))
        except (asyncio.IncompleteReadError, ConnectionError, CrossintercomError):
            pass
        finally:
            if self._reader is reader:
                self.drop()
                self._on_lost()

    def _dispatch(self, frame: p.FromBroker) -> None:
        rid = getattr(frame, "request_id", None)
        if isinstance(frame, p.Deliver | p.Notice) or rid is None:
            if isinstance(frame, p.Error):
                log.warning("broker error: %s: %s", frame.code, frame.message)
            else:
                self._on_frame(frame)
            return
        fut = self._requests.pop(rid, None)
        # A response for a request we no longer wait for (a late answer) is dropped by design.
        if fut is None or fut.done():
            return
        if isinstance(frame, p.Error):
            fut.set_exception(RemoteError(frame.code, frame.message))
        elif isinstance(frame, p.ToRelayFrame):  # never answers a request
            self._on_frame(frame)
        else:
            fut.set_result(frame)

    async def request(self, frame: msgspec.Struct) -> p.BrokerFrame:
        """Send a frame that carries a ``request_id`` (set here) and wait for its answer."""
        writer = self._writer
        if writer is None or writer.is_closing():
            raise Disconnected("not connected to the broker", written=False)
        rid = self._next_rid
        self._next_rid += 1
        data = p.encode(msgspec.structs.replace(frame, request_id=rid))
        if len(data) - p.HEADER.size > self.settings.max_frame_bytes:
            # The broker would drop the connection; retrying would end as a false `unknown`.
            raise RemoteError(
                Code.TOO_LARGE,
                f"frame of {len(data) - p.HEADER.size} bytes exceeds the "
                f"{self.settings.max_frame_bytes}-byte limit; nothing was sent",
            )
        fut: asyncio.Future[p.BrokerFrame] = asyncio.get_running_loop().create_future()
        self._requests[rid] = fut
        out = self._out
        assert out is not None  # set with the writer
        try:
            out.write(self._take_later() + data)
            await writer.drain()
        except (ConnectionError, OSError):
            self._requests.pop(rid, None)
            raise Disconnected("the connection to the broker was lost", written=False) from None
        return await fut

    def post(self, frame: msgspec.Struct) -> bool:
        """Write a frame that expects no answer; False when not connected."""
        return self.post_many((frame,))

    def post_later(self, frame: msgspec.Struct) -> None:
        """Write a frame that expects no answer and may wait: it rides in the next request's
        write, or goes on its own after ``LATER_S`` (one write and one wake-up of the broker
        fewer per operation; docs/performance.md). Dropped if the connection goes first."""
        self._later.append(p.encode(frame))
        if self._later_timer is None:
            loop = asyncio.get_running_loop()
            self._later_timer = loop.call_later(LATER_S, self._flush_later)

    def _take_later(self) -> bytes:
        if self._later_timer is not None:
            self._later_timer.cancel()
            self._later_timer = None
        data, self._later = b"".join(self._later), []
        return data

    def _flush_later(self) -> None:
        self._later_timer = None
        data = self._take_later()
        if data and self._out is not None and not self._out.writer.is_closing():
            self._out.write(data)

    def post_many(self, frames: Sequence[msgspec.Struct]) -> bool:
        """Write frames that expect no answer in one write; False when not connected."""
        out = self._out
        if out is None or out.writer.is_closing():
            return False
        if frames:
            out.write(b"".join(p.encode(f) for f in frames))
        return True
