"""The local wire protocol: length-prefixed JSON frames (DESIGN §3, docs/protocol.md).

A frame is a 4-byte big-endian unsigned length followed by that many bytes of UTF-8 JSON holding
one object. Every frame type is a ``msgspec.Struct`` tagged on ``type``; ``Frame`` is their union,
so decoding validates field names and types in one pass and yields a typed value.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Annotated, Any, Final

import msgspec

from crossintercom.errors import ProtocolError

PROTOCOL_VERSION: Final = 1
DEFAULT_MAX_FRAME: Final = 8 * 1024 * 1024
HEADER = struct.Struct(">I")

Name = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
SessionId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
MessageId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Text = str
RequestId = Annotated[int, msgspec.Meta(ge=0)]


# --- payload pieces ---------------------------------------------------------------------------


class AttachmentBody(msgspec.Struct, frozen=True):
    kind: str
    name: str
    content: str
    language: str | None = None


class SessionBody(msgspec.Struct, frozen=True):
    id: SessionId
    name: Name | None = None
    cwd: str | None = None
    model: str | None = None
    status: str | None = None
    purpose: str = "agent"
    groups: list[Name] | None = None
    durable: bool = False


class OutgoingBody(msgspec.Struct, frozen=True):
    """What a sender supplies; the broker adds sender and time."""

    id: MessageId
    message: Text
    to: str | None = None
    attachments: list[AttachmentBody] = []
    reply_to: MessageId | None = None
    expects_reply: bool = False


# --- client -> broker ---------------------------------------------------------------------------


class Register(msgspec.Struct, tag="register", frozen=True):
    request_id: RequestId
    protocol: int
    session: SessionBody
    # "own": this connection becomes the session's owner (listen); "auto": attach to the live
    # owner if there is one, else own it for the life of the connection (one-shot commands).
    mode: str = "own"
    # Ids of asks this session made that the connection still waits on (after a reconnect).
    awaiting: list[MessageId] = []


class Send(msgspec.Struct, tag="send", frozen=True):
    """send and ask (``expects_reply``) share one frame."""

    request_id: RequestId
    message: OutgoingBody


class Reply(msgspec.Struct, tag="reply", frozen=True):
    request_id: RequestId
    message: OutgoingBody


class Ack(msgspec.Struct, tag="ack", frozen=True):
    """The recipient's client saved the message to its durable inbox."""

    id: MessageId
    refused: str | None = None


class Confirm(msgspec.Struct, tag="confirm", frozen=True):
    """The sender has these outcomes; the broker may release their dedup records."""

    ids: list[MessageId]


class ListSessions(msgspec.Struct, tag="list", frozen=True):
    request_id: RequestId


class Status(msgspec.Struct, tag="status", frozen=True):
    request_id: RequestId


class Groups(msgspec.Struct, tag="groups", frozen=True):
    request_id: RequestId


class Join(msgspec.Struct, tag="join", frozen=True):
    request_id: RequestId
    group: Name


class Leave(msgspec.Struct, tag="leave", frozen=True):
    request_id: RequestId
    group: Name


class SetStatus(msgspec.Struct, tag="set_status", frozen=True):
    request_id: RequestId
    status: str | None


class Pending(msgspec.Struct, tag="pending", frozen=True):
    request_id: RequestId


class Ping(msgspec.Struct, tag="ping", frozen=True):
    request_id: RequestId


# --- relay (control) <-> broker -----------------------------------------------------------------


class RemoteRoster(msgspec.Struct, tag="remote_roster", frozen=True):
    """The relay's copy of every other host's sessions."""

    sessions: list[dict[str, Any]]
    request_id: RequestId | None = None


class Inbound(msgspec.Struct, tag="inbound", frozen=True):
    """A message from the store for a local session; answered with ``result``."""

    request_id: RequestId
    message: dict[str, Any]
    recipient: SessionId


class ForwardResult(msgspec.Struct, tag="forward_result", frozen=True):
    """The relay's answer to a ``forward``: one receipt per remote recipient."""

    fid: int
    receipts: list[dict[str, Any]]


class RemoteReceipt(msgspec.Struct, tag="remote_receipt", frozen=True):
    """Receipts arriving later from other hosts for messages this host sent."""

    receipts: list[dict[str, Any]]


class RosterRefresh(msgspec.Struct, tag="roster_refreshed", frozen=True):
    fid: int


ClientFrame = (
    Register
    | Send
    | Reply
    | Ack
    | Confirm
    | ListSessions
    | Status
    | Groups
    | Join
    | Leave
    | SetStatus
    | Pending
    | Ping
    | RemoteRoster
    | Inbound
    | ForwardResult
    | RemoteReceipt
    | RosterRefresh
)

CLIENT_TYPES: Final = frozenset(t.__struct_config__.tag for t in ClientFrame.__args__)
# Frames a connection may send before it registers: queries that need no identity (DESIGN §3)
# and the acknowledgements that never act on anyone's behalf.
ANONYMOUS_TYPES: Final = frozenset({"register", "list", "status", "groups", "ping", "confirm"})

_decoder: msgspec.json.Decoder[ClientFrame] = msgspec.json.Decoder(ClientFrame)
_any_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def decode_client_frame(data: bytes) -> ClientFrame:
    """Decode one frame body, or raise ``ProtocolError`` with a stable code."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise _diagnose(data, exc) from None


def _diagnose(data: bytes, exc: msgspec.DecodeError) -> ProtocolError:
    # Decoding into the union failed; decode generically to say *why* with a stable code.
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return ProtocolError("frame is not valid UTF-8", code="bad_utf8")
    try:
        obj = _any_decoder.decode(data)
    except msgspec.DecodeError:
        return ProtocolError("frame is not valid JSON", code="bad_json")
    if not isinstance(obj, dict):
        return ProtocolError(
            f"frame must be a JSON object, got {type(obj).__name__}", code="not_object"
        )
    ftype = obj.get("type")
    if not isinstance(ftype, str):
        return ProtocolError("frame has no string 'type' field", code="missing_field")
    if ftype not in CLIENT_TYPES:
        return ProtocolError(f"unknown frame type {ftype!r}", code="unknown_type")
    detail = str(exc)
    code = "missing_field" if "missing required field" in detail else "bad_field"
    return ProtocolError(f"invalid {ftype!r} frame: {detail}", code=code)


def encode(obj: Any) -> bytes:
    """One frame on the wire: length header + JSON body."""
    body = _encoder.encode(obj)
    return HEADER.pack(len(body)) + body


def decode_any(data: bytes) -> Any:
    """Decode a broker->client frame body (clients trust their broker's shapes)."""
    try:
        return _any_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"broker sent invalid JSON: {exc}", code="bad_json") from None


def error_frame(
    code: str, message: str, request_id: int | None = None, **extra: Any
) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if request_id is not None:
        frame["request_id"] = request_id
    frame.update(extra)
    return frame


class FrameTooLarge(ProtocolError):
    """Frame exceeds the size limit."""

    code = "frame_too_large"


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
