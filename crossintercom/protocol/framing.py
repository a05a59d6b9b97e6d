"""Framing on the Unix socket: a 4-byte big-endian length, then that many bytes of JSON."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Any, Final, Protocol

import msgspec

from crossintercom.errors import Code, ProtocolError

PROTOCOL_VERSION: Final = 1
DEFAULT_MAX_FRAME: Final = 8 * 1024 * 1024
HEADER = struct.Struct(">I")

_encoder = msgspec.json.Encoder()


class FrameTooLarge(ProtocolError):
    """Frame exceeds the size limit."""

    code = Code.FRAME_TOO_LARGE


def encode(frame: Any) -> bytes:
    """One frame on the wire: length header + JSON body (a frame struct, or a plain dict)."""
    body = _encoder.encode(frame)
    return HEADER.pack(len(body)) + body


async def read_length(
    reader: asyncio.StreamReader, max_frame: int = DEFAULT_MAX_FRAME
) -> int | None:
    """Read one frame's length header; ``None`` at a clean end of stream.

    Raises ``FrameTooLarge`` for a length over ``max_frame`` (the stream is then unusable and
    the caller closes it) and ``asyncio.IncompleteReadError`` on truncation.
    """
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    length: int = HEADER.unpack(header)[0]
    if length > max_frame:
        raise FrameTooLarge(f"frame of {length} bytes exceeds the {max_frame}-byte limit")
    return length


async def read_frame(
    reader: asyncio.StreamReader, max_frame: int = DEFAULT_MAX_FRAME
) -> bytes | None:
    """Read one frame body; ``None`` at a clean end of stream. Raises as ``read_length`` does,
    and ``asyncio.IncompleteReadError`` on a body cut short."""
    length = await read_length(reader, max_frame)
    return None if length is None else await reader.readexactly(length)


class FrameWriter(Protocol):
    """What frames are written to: a socket's ``asyncio.StreamWriter``, or a gateway's
    WebSocket (client/gateway_link.py) taking the same bytes."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


class Coalescer:
    """Writes to one stream: the first of a loop turn goes out at once, the others of that turn
    together when it ends. A burst then costs one system call and one wake-up of the peer, and
    a lone frame waits for nothing (docs/perf-log/2026-12.md, "Same-host path reshaped")."""

    def __init__(self, writer: FrameWriter) -> None:
        self.writer = writer
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._turn = False
        self._extend = False

    @property
    def held_bytes(self) -> int:
        """Bytes written but not handed to the transport yet."""
        return self._held_bytes

    def write(self, data: bytes) -> None:
        """Raises as ``StreamWriter.write`` does, for a write made at once."""
        if not self._turn:
            self._turn = True
            asyncio.get_running_loop().call_soon(self._end_turn)
            self.writer.write(data)
            return
        self._held.append(data)
        self._held_bytes += len(data)

    def hold_turn(self) -> None:
        """Hold every write until the end of the loop's next turn, the first too: for a batch
        whose frames are written by tasks that start on that turn (one write for all of them,
        so the peer reads, saves and acknowledges them once)."""
        if self._turn:
            self._extend = True  # this turn's end is already due before those tasks run
            return
        self._turn = True
        asyncio.get_running_loop().call_soon(self._end_turn)

    def flush(self) -> None:
        """Hand what is held to the transport now (before a close)."""
        if not self._held:
            return
        data, self._held, self._held_bytes = b"".join(self._held), [], 0
        if not self.writer.is_closing():
            # A failed write shows as the connection lost, which its read loop handles.
            with contextlib.suppress(OSError, RuntimeError):
                self.writer.write(data)

    def _end_turn(self) -> None:
        if self._extend:
            self._extend = False
            asyncio.get_running_loop().call_soon(self._end_turn)
            return
        self._turn = False
        self.flush()
