"""The session registry in process, over a real broker.sqlite in a temp dir."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from crossintercom.local_broker.sessions.registry import Live, Registry
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import Peer, SessionInfo, durable_session_id


def test_durable_sessions_are_remembered_across_restarts(tmp_path: Path) -> None:
    state = BrokerState(tmp_path)
    reg = Registry("alpha", state)
    info = SessionInfo(id="s1", host="alpha", name="worker", groups=("team",), durable=True)
    reg.live["s1"] = Live(info, owner=None)
    reg.remember(info)
    reg.remember(SessionInfo(id="s2", host="alpha", name="eph"))  # not durable: not kept
    state.close()

    again = Registry("alpha", BrokerState(tmp_path))
    assert again.is_durable("s1") and not again.is_durable("s2")
    [offline] = again.local_sessions()
    assert (offline.id, offline.name, offline.groups, offline.online) == (
        "s1",
        "worker",
        ("team",),
        False,
    )
    assert again.initial_groups("s1", None, durable=True) == ("team",)
    assert again.initial_groups("s1", ["x"], durable=True) == ("x",)
    assert again.initial_groups("s9", None, durable=True) == ("default",)


def test_remote_sessions_exclude_this_host_and_sender_presence(tmp_path: Path) -> None:
    reg = Registry("alpha", BrokerState(tmp_path))
    reg.set_remote(
        [
            SessionInfo(id="r1", host="beta", name="w"),
            SessionInfo(id="r2", host="beta", name="x", online=False),
            SessionInfo(id="me", host="alpha", name="echo"),  # our own, echoed back
        ]
    )
    assert sorted(reg.remote) == ["r1", "r2"]
    assert reg.sender_online(Peer("r1", "w", "beta"))
    assert not reg.sender_online(Peer("r2", "x", "beta"))
    assert not reg.sender_online(Peer("gone", None, "alpha"))
    assert [s.alias for s in reg.all_sessions()] == ["w", "x"]


def test_remote_claims_a_host_cannot_rightly_make_are_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Indexed by id, a stolen claim would reroute mail: a durable id that is not its host's
    and name's goes, and so does every claim of an id two hosts make, whatever the order."""
    reg = Registry("alpha", BrokerState(tmp_path))
    real = SessionInfo(id=durable_session_id("beta", "w"), host="beta", name="w", durable=True)
    stolen = SessionInfo(id=real.id, host="evil", name="w", durable=True)
    twice = [SessionInfo(id="e1", host="beta"), SessionInfo(id="e1", host="evil")]
    for order in ([stolen, real, *twice], [*reversed(twice), real, stolen]):
        with caplog.at_level(logging.WARNING):
            reg.set_remote(order)
        assert {(s.id, s.host) for s in reg.remote.values()} == {(real.id, "beta")}
    assert "remote sessions dropped" in caplog.text
