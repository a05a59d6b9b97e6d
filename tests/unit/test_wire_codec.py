"""The wire protocol's encoding (docs/protocol.md): every frame type round-trips, error frames
keep their shape, and new fields stay readable by older peers both ways. Against a live
broker: tests/protocol/test_wire.py."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import msgspec
import pytest

from crossintercom import protocol as p
from crossintercom.models import Message, Outcome, Peer, Receipt, SessionInfo


def sid() -> str:
    return str(uuid.uuid4())


SAMPLES: list[Any] = [
    p.Register(
        request_id=1,
        protocol=p.PROTOCOL_VERSION,
        session=p.SessionBody(id=sid(), name="worker", groups=["g"], durable=True),
        mode="auto",
    ),
    p.Send(
        request_id=2,
        message=p.OutgoingBody(
            id=sid(),
            message="hi",
            to="worker",
            attachments=[p.AttachmentBody("snippet", "x.py", "print(1)", "python")],
            expects_reply=True,
            subject="release plan",
            thread_id=sid(),
        ),
        wait_s=120.0,
    ),
    p.Reply(request_id=3, message=p.OutgoingBody(id=sid(), message="yes", reply_to=sid())),
    p.Ack(id=sid(), refused="too_large"),
    p.Confirm(ids=[sid(), sid()]),
    p.ListSessions(request_id=4),
    p.Status(request_id=5),
    p.Counts(request_id=5),
    p.Groups(request_id=6),
    p.Join(request_id=7, group="team"),
    p.Leave(request_id=8, group="team"),
    p.SetStatus(request_id=9, status="busy"),
    p.Pending(request_id=10),
    p.Ping(request_id=11),
    p.Shown(messages=[p.ShownItem(id=sid(), sender=Peer("s", "planner", "h2"))]),
    p.SetWake(request_id=14, wake="asks"),
    p.Forget(request_id=15, session=sid()),
    p.InboxFault(faults=[p.InboxFaultItem(op="read", since=1.5, error="disk I/O error")]),
    p.Traffic(request_id=17, after=3, limit=50),
    p.Acknowledge(messages=[p.ShownItem(id=sid(), sender=Peer("s", "planner", "h2"))], note="ok"),
    p.AckWaits(request_id=18),
    p.DeadLetters(request_id=19, everyone=True),
    p.Resend(request_id=20, id=sid(), new_id=sid()),
    p.InboundPolicy(request_id=21, pattern="pest@h2", action="refuse", release=["*"]),
    p.Reserve(request_id=22, project="github.com/o/app", globs=["src/**"], reason="split"),
    p.Unreserve(request_id=23, project="app", globs=["src/**"]),
    p.Reservations(request_id=24),
    p.ReservationReply(fid=5, code="reservation_conflict", message="clash"),
    p.RemoteRoster(sessions=[SessionInfo(id="x", host="h2")], request_id=12),
    p.Inbound(
        request_id=13, message=Message(id="m", sender=Peer("s", None, "h2")), recipient=sid()
    ),
    p.InboundBatch(
        request_id=16,
        recipient=sid(),
        messages=[
            Message(id="m1", sender=Peer("s", None, "h2")),
            Message(id="m2", sender=Peer("s", None, "h2")),
        ],
    ),
    p.ForwardResult(fid=1, receipts=[Receipt(id="m", outcome=Outcome.QUEUED)]),
    p.RemoteReceipt(receipts=[p.SenderReceipt(id="m", outcome=Outcome.DELIVERED, sender="s")]),
    p.RosterRefreshed(fid=2),
    p.ArchiveState(enabled=True),
]


def test_samples_cover_every_client_frame_type() -> None:
    assert {type(s).__struct_config__.tag for s in SAMPLES} == set(p.CLIENT_TYPES)


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: type(f).__struct_config__.tag)
def test_every_frame_type_round_trips(frame: Any) -> None:
    wire = p.encode(frame)
    (length,) = struct.unpack(">I", wire[:4])
    assert length == len(wire) - 4
    body = wire[4:]
    assert msgspec.json.decode(body)["type"] == type(frame).__struct_config__.tag
    assert p.decode_client_frame(body) == frame


def test_a_traffic_log_round_trips() -> None:
    event = p.TrafficEvent(
        1,
        1.5,
        "m",
        [p.TrafficReceipt(Outcome.SHOWN, recipient="r", name="bob", host="h2")],
        Message(id="m", sender=Peer("s", None, "h2")),
    )
    log = p.TrafficLog(request_id=17, events=[event, p.TrafficEvent(2, 2.5, "m")], first=1, last=2)
    assert p.decode_broker_frame(p.encode(log)[4:]) == log


def test_error_frame_shape() -> None:
    assert msgspec.json.decode(p.encode(p.Error("bad_json", "nope", 7))[4:]) == {
        "type": "error",
        "code": "bad_json",
        "message": "nope",
        "request_id": 7,
    }
    assert "request_id" not in msgspec.json.decode(p.encode(p.Error("bad_json", "nope"))[4:])


def test_the_archive_frames_round_trip_and_stay_readable_both_ways() -> None:
    """``archive_receipts``, an ask's ``wait_s`` and ``archive_state.receipts`` are new: left
    out when unset, so an older peer reads the rest as before, and an older peer's frames
    read as "no wait" and "no receipts frames" (docs/protocol.md)."""
    msg = Message(id="m", sender=Peer("s", None, "h1"))
    copy = p.ArchiveCopy(msg, [Receipt(id="m", outcome=Outcome.QUEUED)], wait_s=30.0)
    later = p.ArchiveReceipts([p.ArchiveReceipt("m", "r", "shown")])
    for frame in (copy, later):
        assert p.decode_broker_frame(p.encode(frame)[4:]) == frame
    plain = msgspec.json.decode(p.encode(p.ArchiveCopy(msg, []))[4:])
    assert "wait_s" not in plain
    assert msgspec.json.decode(p.encode(p.ArchiveState(True))[4:]) == {
        "type": "archive_state",
        "enabled": True,
    }
    assert p.decode_client_frame(b'{"type": "archive_state", "enabled": true}') == (
        p.ArchiveState(True, receipts=False)
    )
