"""Dedup authority (docs/delivery.md): decisions, durability, TTL, bounds, and a model-based
property (across a SIGKILL: test_authority_sigkill.py; damaged files: test_authority_files.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossintercom.errors import AuthorityError
from crossintercom.local_broker.authority.dedup import Decision, DecisionKind, DedupAuthority

OUTCOME = {"id": "m1", "outcome": "delivered", "recipient": "s-1"}


class FakeClock:
    """A settable clock; used for both the monotonic and the wall clock."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def mono() -> FakeClock:
    return FakeClock(1_000.0)


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(1_700_000_000.0)


@pytest.fixture
def open_auth(
    tmp_path: Path, mono: FakeClock, wall: FakeClock
) -> Iterator[Callable[..., DedupAuthority]]:
    opened: list[DedupAuthority] = []

    def _open(**kw: Any) -> DedupAuthority:
        kw.setdefault("clock", mono)
        kw.setdefault("wall", wall)
        auth = DedupAuthority(tmp_path, **kw)
        opened.append(auth)
        return auth

    yield _open
    for auth in opened:
        auth.close()


# -- decisions ---------------------------------------------------------------------------------


def test_decisions(open_auth: Callable[..., DedupAuthority]) -> None:
    auth = open_auth()
    assert auth.lodge("m1", b"payload") == Decision(DecisionKind.NEW)
    assert auth.lodge("m1", b"payload") == Decision(DecisionKind.UNCERTAIN)
    assert auth.lodge("m1", b"payload", remote=True) == Decision(DecisionKind.FORWARD_AGAIN)
    assert auth.lodge("m1", b"other") == Decision(DecisionKind.CONFLICT)
    auth.accept("m1", OUTCOME)
    assert auth.lodge("m1", b"payload") == Decision(DecisionKind.RETAINED, OUTCOME)
    assert auth.lodge("m1", b"payload", remote=True) == Decision(DecisionKind.RETAINED, OUTCOME)
    assert auth.lodge("m1", b"other").kind is DecisionKind.CONFLICT


def test_files_created_private_and_hold_no_text(tmp_path: Path) -> None:
    with DedupAuthority(tmp_path) as auth:
        auth.lodge("m1", b"a very secret message text")
        auth.accept("m1", OUTCOME)
    key = tmp_path / DedupAuthority.KEY
    assert key.stat().st_mode & 0o777 == 0o600
    assert key.stat().st_size == 32
    assert (tmp_path / DedupAuthority.FILE).stat().st_mode & 0o777 == 0o600
    for path in tmp_path.iterdir():
        assert b"secret message" not in path.read_bytes()


def test_outcome_with_text_refused(open_auth: Callable[..., DedupAuthority]) -> None:
    auth = open_auth()
    auth.lodge("m1", b"p")
    with pytest.raises(ValueError, match="text"):
        auth.accept("m1", {"id": "m1", "receipts": [{"text": "hello"}]})
    with pytest.raises(KeyError):
        auth.accept("nope", OUTCOME)
    assert auth.lodge("m1", b"p").kind is DecisionKind.UNCERTAIN


def test_accept_survives_restart(open_auth: Callable[..., DedupAuthority]) -> None:
    auth = open_auth()
    auth.lodge("m1", b"p")
    auth.lodge("m2", b"q")
    auth.accept("m1", OUTCOME)
    auth.close()
    auth = open_auth()
    assert auth.lodge("m1", b"p") == Decision(DecisionKind.RETAINED, OUTCOME)
    assert auth.lodge("m2", b"q").kind is DecisionKind.UNCERTAIN
    assert auth.lodge("m2", b"x").kind is DecisionKind.CONFLICT
    assert auth.stats()[0] == 2


def test_second_open_refused_while_in_use(open_auth: Callable[..., DedupAuthority]) -> None:
    open_auth()
    with pytest.raises(AuthorityError, match="in use"):
        open_auth()


def test_discard_and_abandon(open_auth: Callable[..., DedupAuthority]) -> None:
    auth = open_auth()
    auth.lodge("m1", b"p")
    auth.accept("m1", OUTCOME)
    with pytest.raises(ValueError, match="accepted"):
        auth.abandon("m1")
    auth.discard("m1")
    auth.discard("m1")  # a repeated confirmation is harmless
    assert auth.stats() == (0, 0)
    assert auth.lodge("m1", b"p").kind is DecisionKind.NEW
    auth.abandon("m1")
    assert auth.lodge("m1", b"other").kind is DecisionKind.NEW
    auth.abandon("never-seen")
    for i in range(5):
        auth.lodge(f"b{i}", b"p")
    auth.accept_many([(f"b{i}", {"id": f"b{i}"}) for i in range(3)])
    auth.discard_many([f"b{i}" for i in range(5)] + ["unknown", "b0"])
    assert auth.stats() == (1, auth.stats()[1])  # only m1 left
    auth.close()
    auth = open_auth()
    assert auth.lodge("b0", b"p").kind is DecisionKind.NEW
    assert auth.lodge("m1", b"p").kind is DecisionKind.CONFLICT  # m1 was re-lodged with b"other"


def test_discard_then_lodge_again_keeps_the_new_record(
    open_auth: Callable[..., DedupAuthority],
) -> None:
    auth = open_auth()
    auth.lodge("m1", b"p")
    auth.accept("m1", OUTCOME)
    auth.discard("m1")
    assert (
        auth.lodge("m1", b"second").kind is DecisionKind.NEW
    )  # DELETE then INSERT, one transaction
    auth.flush_discarded()  # nothing pending: no write
    auth.close()
    auth = open_auth()
    assert auth.lodge("m1", b"second").kind is DecisionKind.UNCERTAIN
    assert auth.lodge("m1", b"p").kind is DecisionKind.CONFLICT


def test_synchronous_level(tmp_path: Path) -> None:
    for level, code in (("NORMAL", 1), ("FULL", 2)):
        with DedupAuthority(tmp_path, synchronous=level) as auth:
            conn = auth._require_open()
            assert conn.execute("PRAGMA synchronous").fetchone()[0] == code
    with pytest.raises(ValueError, match="NORMAL or FULL"):
        DedupAuthority(tmp_path, synchronous="OFF")


# -- time --------------------------------------------------------------------------------------


def test_ttl_expiry(open_auth: Callable[..., DedupAuthority], mono: FakeClock) -> None:
    auth = open_auth(ttl_s=720.0)
    auth.lodge("m1", b"p")
    mono.now += 100
    auth.lodge("m2", b"p")
    auth.accept("m2", OUTCOME)
    mono.now += 619.9
    assert auth.sweep() == 0
    assert auth.lodge("m1", b"p").kind is DecisionKind.UNCERTAIN
    mono.now += 0.1
    assert (
        auth.lodge("m1", b"other").kind is DecisionKind.NEW
    )  # m1 expired, so the id is free again
    assert auth.lodge("m2", b"p").kind is DecisionKind.RETAINED
    mono.now += 100
    assert auth.sweep() == 1
    assert auth.stats()[0] == 1


def test_wall_jump_in_process_ignored(
    open_auth: Callable[..., DedupAuthority], mono: FakeClock, wall: FakeClock
) -> None:
    auth = open_auth()
    auth.lodge("m1", b"p")
    wall.now += 86_400
    mono.now += 1
    assert auth.sweep() == 0
    assert auth.lodge("m1", b"p").kind is DecisionKind.UNCERTAIN
    wall.now -= 2 * 86_400
    mono.now += 718
    assert auth.lodge("m1", b"p").kind is DecisionKind.UNCERTAIN
    mono.now += 1
    assert auth.sweep() == 1


def test_wall_jump_backwards_across_restart(
    open_auth: Callable[..., DedupAuthority], mono: FakeClock, wall: FakeClock
) -> None:
    auth = open_auth()
    auth.lodge("m1", b"p")
    auth.close()
    wall.now -= 3_600  # the record now looks like it has 4,320 s left
    mono.now += 5
    auth = open_auth()
    mono.now += 719
    assert auth.lodge("m1", b"p").kind is DecisionKind.UNCERTAIN
    mono.now += 1
    assert auth.sweep() == 1

    # The clamp is persisted: a later restart cannot add another ttl_s.
    auth.lodge("m2", b"p")
    auth.close()
    wall.now -= 3_600
    auth = open_auth()
    auth.close()
    wall.now += 600
    mono.now += 600
    auth = open_auth()
    mono.now += 119
    assert auth.lodge("m2", b"p").kind is DecisionKind.UNCERTAIN
    mono.now += 1
    assert auth.sweep() == 1


def test_wall_jump_forwards_across_restart_expires_early(
    open_auth: Callable[..., DedupAuthority], wall: FakeClock
) -> None:
    auth = open_auth()
    auth.lodge("m1", b"p")
    auth.lodge("m2", b"p")
    auth.accept("m2", OUTCOME)
    auth.close()
    wall.now += 3_600
    auth = open_auth()
    assert auth.stats() == (0, 0)
    assert auth.lodge("m1", b"p").kind is DecisionKind.NEW


# -- bounds ------------------------------------------------------------------------------------


def test_record_bound_refuses_new_keeps_old(
    open_auth: Callable[..., DedupAuthority], mono: FakeClock
) -> None:
    auth = open_auth(max_records=3)
    for i in range(3):
        assert auth.lodge(f"m{i}", b"p").kind is DecisionKind.NEW
    auth.accept("m0", OUTCOME)
    assert auth.lodge("m3", b"p").kind is DecisionKind.OVER_CAPACITY
    assert auth.lodge("m0", b"p").kind is DecisionKind.RETAINED
    assert auth.lodge("m1", b"p").kind is DecisionKind.UNCERTAIN
    assert auth.lodge("m2", b"x").kind is DecisionKind.CONFLICT
    auth.discard("m1")
    assert auth.lodge("m3", b"p").kind is DecisionKind.NEW
    assert auth.lodge("m4", b"p").kind is DecisionKind.OVER_CAPACITY
    mono.now += 720  # everything expires; lodge sweeps before refusing
    assert auth.lodge("m4", b"p").kind is DecisionKind.NEW
    assert auth.stats()[0] == 1


def test_byte_bound(open_auth: Callable[..., DedupAuthority], mono: FakeClock) -> None:
    auth = open_auth(max_bytes=400)
    assert auth.lodge("m1", b"p").kind is DecisionKind.NEW
    per_record = auth.stats()[1]
    assert per_record >= 64 + 64
    auth.accept("m1", {"id": "m1", "receipts": ["r" * 200]})
    assert auth.stats()[1] > per_record + 200
    assert auth.lodge("m2", b"p").kind is DecisionKind.OVER_CAPACITY
    assert auth.lodge("m1", b"p").kind is DecisionKind.RETAINED
    mono.now += 720
    assert auth.sweep() == 1
    assert auth.stats() == (0, 0)
    assert auth.lodge("m2", b"p").kind is DecisionKind.NEW


def test_sustained_traffic_never_hits_bound(tmp_path: Path) -> None:
    with DedupAuthority(tmp_path, max_records=10_000) as auth:
        for i in range(20_000):
            op_id = f"op-{i}"
            assert auth.lodge(op_id, op_id.encode()).kind is DecisionKind.NEW
            auth.accept(op_id, {"id": op_id, "outcome": "delivered"})
            auth.discard(op_id)
        assert auth.stats() == (0, 0)


# -- model-based property ----------------------------------------------------------------------

_IDS = st.sampled_from(["a", "b", "c", "d", "e"])
_PAYLOADS = st.sampled_from([b"p", b"q"])
_STEPS = st.one_of(
    st.tuples(st.just("lodge"), _IDS, _PAYLOADS, st.booleans()),
    st.tuples(st.just("accept"), _IDS, st.integers(0, 3)),
    st.tuples(st.just("discard"), _IDS),
    st.tuples(st.just("abandon"), _IDS),
    st.tuples(
        st.just("reopen"),
    ),
)
_MAX = 3


def _model_lodge(
    model: dict[str, tuple[bytes, dict[str, Any] | None]], op_id: str, payload: bytes, remote: bool
) -> Decision:
    if op_id not in model:
        if len(model) >= _MAX:
            return Decision(DecisionKind.OVER_CAPACITY)
        model[op_id] = (payload, None)
        return Decision(DecisionKind.NEW)
    stored, outcome = model[op_id]
    if stored != payload:
        return Decision(DecisionKind.CONFLICT)
    if outcome is not None:
        return Decision(DecisionKind.RETAINED, outcome)
    return Decision(DecisionKind.FORWARD_AGAIN if remote else DecisionKind.UNCERTAIN)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(steps=st.lists(_STEPS, max_size=40))
def test_matches_dict_model(steps: list[tuple[Any, ...]]) -> None:
    model: dict[str, tuple[bytes, dict[str, Any] | None]] = {}
    clock = FakeClock(0.0)  # frozen: nothing expires, only the operations matter
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        auth = DedupAuthority(directory, max_records=_MAX, clock=clock, wall=clock)
        try:
            for step in steps:
                match step:
                    case ("lodge", op_id, payload, remote):
                        expected = _model_lodge(model, op_id, payload, remote)
                        assert auth.lodge(op_id, payload, remote=remote) == expected
                    case ("accept", op_id, n):
                        outcome = {"id": op_id, "n": n}
                        if op_id in model:
                            auth.accept(op_id, outcome)
                            model[op_id] = (model[op_id][0], outcome)
                        else:
                            with pytest.raises(KeyError):
                                auth.accept(op_id, outcome)
                    case ("discard", op_id):
                        auth.discard(op_id)
                        model.pop(op_id, None)
                    case ("abandon", op_id):
                        if op_id in model and model[op_id][1] is not None:
                            with pytest.raises(ValueError):
                                auth.abandon(op_id)
                        else:
                            auth.abandon(op_id)
                            model.pop(op_id, None)
                    case ("reopen",):
                        auth.close()
                        auth = DedupAuthority(directory, max_records=_MAX, clock=clock, wall=clock)
                assert auth.stats()[0] == len(model)
        finally:
            auth.close()
