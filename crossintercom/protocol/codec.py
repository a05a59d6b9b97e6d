"""Decoding frame bodies into the typed unions, with a stable code for every failure."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from crossintercom.errors import Code, ProtocolError
from crossintercom.protocol.broker_frames import BrokerFrame
from crossintercom.protocol.client_frames import ClientFrame
from crossintercom.protocol.relay_frames import RelayFrame, ToRelayFrame

# What a broker reads from a connection: an agent's frames or, from the relay, the link's.
ToBroker = ClientFrame | RelayFrame
# What a client reads from its broker; the relay's client also gets the link's frames.
FromBroker = BrokerFrame | ToRelayFrame

CLIENT_TYPES: Final = frozenset(t.__struct_config__.tag for t in ToBroker.__args__)
RELAY_TYPES: Final = frozenset(t.__struct_config__.tag for t in RelayFrame.__args__)

_to_broker: msgspec.json.Decoder[ToBroker] = msgspec.json.Decoder(ToBroker)
_from_broker: msgspec.json.Decoder[FromBroker] = msgspec.json.Decoder(FromBroker)
_any: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def decode_client_frame(data: bytes) -> ToBroker:
    """Decode one frame a broker received, or raise ``ProtocolError`` with a stable code."""
    try:
        return _to_broker.decode(data)
    except msgspec.DecodeError as exc:
        raise _diagnose(data, exc) from None


def decode_broker_frame(data: bytes) -> FromBroker:
    """Decode one frame a client received from its broker."""
    try:
        return _from_broker.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"broker sent an invalid frame: {exc}", code=Code.BAD_FIELD) from None


def frame_type(data: bytes) -> str | None:
    """Best effort: the ``type`` of a frame body that failed validation."""
    obj = _loose(data)
    ftype = obj.get("type") if isinstance(obj, dict) else None
    return ftype if isinstance(ftype, str) else None


def request_id_of(data: bytes) -> int | None:
    """Best effort: echo the request id of a frame that failed validation."""
    obj = _loose(data)
    rid = obj.get("request_id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else None


def _loose(data: bytes) -> Any:
    try:
        return _any.decode(data)
    except msgspec.DecodeError:
        return None


def _diagnose(data: bytes, exc: msgspec.DecodeError) -> ProtocolError:
    # Decoding into the union failed; decode generically to say *why* with a stable code.
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return ProtocolError("frame is not valid UTF-8", code=Code.BAD_UTF8)
    try:
        obj = _any.decode(data)
    except msgspec.DecodeError:
        return ProtocolError("frame is not valid JSON", code=Code.BAD_JSON)
    if not isinstance(obj, dict):
        return ProtocolError(
            f"frame must be a JSON object, got {type(obj).__name__}", code=Code.NOT_OBJECT
        )
    ftype = obj.get("type")
    if not isinstance(ftype, str):
        return ProtocolError("frame has no string 'type' field", code=Code.MISSING_FIELD)
    if ftype not in CLIENT_TYPES:
        return ProtocolError(f"unknown frame type {ftype!r}", code=Code.UNKNOWN_TYPE)
    detail = str(exc)
    code = Code.MISSING_FIELD if "missing required field" in detail else Code.BAD_FIELD
    return ProtocolError(f"invalid {ftype!r} frame: {detail}", code=code)
