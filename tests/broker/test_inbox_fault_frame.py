"""The ``inbox_fault`` frame over the broker's real socket (docs/protocol.md): a registered
session's report shows in ``status`` with since when, an empty one or the connection's end
clears it, and one from an unregistered connection or with a bad field is refused."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from tests.conftest import RawConn, make_env, start_broker


def _sent(c: RawConn, frame: dict[str, object]) -> None:
    """Send a frame that has no answer; a ping after it proves the broker handled it."""
    c.send(frame)
    assert c.request({"type": "ping"})["type"] == "pong"


def _warnings(home: Path) -> list[str]:
    with RawConn(home) as c:
        found: list[str] = c.request({"type": "status"})["warnings"]
        return found


def test_a_reported_inbox_fault_shows_in_status_until_cleared(runtime_home: Path) -> None:
    start_broker(make_env(runtime_home))
    since = time.time() - 30
    fault = {"op": "read", "since": since, "error": "disk I/O error"}
    with RawConn(runtime_home) as c:
        c.register(str(uuid.uuid4()), name="reader", durable=True)
        _sent(c, {"type": "inbox_fault", "faults": [fault]})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
        [line] = [w for w in _warnings(runtime_home) if "reader" in w]
        assert line.startswith(f"inbox unreadable: reader cannot read its inbox since {stamp}")
        assert "(disk I/O error)" in line
        _sent(c, {"type": "inbox_fault", "faults": []})
        assert not [w for w in _warnings(runtime_home) if "reader" in w]
        _sent(c, {"type": "inbox_fault", "faults": [{**fault, "op": "write"}]})
        assert any("inbox unwritable: reader" in w for w in _warnings(runtime_home))
    # the reporting connection ended: its session's report goes with it
    assert not [w for w in _warnings(runtime_home) if "reader" in w]


def test_a_bad_or_anonymous_report_is_refused(runtime_home: Path) -> None:
    start_broker(make_env(runtime_home))
    fault = {"op": "read", "since": 1.0, "error": "x"}
    with RawConn(runtime_home) as c:
        c.send({"type": "inbox_fault", "faults": [fault]})
        err = c.recv_type("error")
        assert err["code"] == "not_registered", err
        c.register(str(uuid.uuid4()), name="solo")
        c.send({"type": "inbox_fault", "faults": [{**fault, "op": "erase"}]})
        err = c.recv_type("error")
        assert err["code"] == "bad_field", err
        assert c.request({"type": "ping"})["type"] == "pong"
    assert _warnings(runtime_home) == []
