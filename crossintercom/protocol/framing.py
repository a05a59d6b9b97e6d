"""Framing on the Unix socket: a 4-byte big-endian length, then that many bytes of JSON."""

from __future__ import annotations

import asyncio
import struct
from typing import Any, Final

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


async def read_frame(
    reader: asyncio.StreamReader, max_frame: int = DEFAULT_MAX_FRAME
) -> bytes | None:
    """Read one frame body; ``None`` at a clean end of stream.

    Raises ``FrameTooLarge`` before reading an oversize body (the stream is then unusable and
    the caller closes it) and ``asyncio.IncompleteReadError`` on truncation.
    """
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    (length,) = HEADER.unpack(header)
    if length > max_frame:
        raise FrameTooLarge(f"frame of {length} bytes exceeds the {max_frame}-byte limit")
    return await reader.readexactly(length)
