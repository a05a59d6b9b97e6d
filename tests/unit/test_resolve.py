"""Target resolution rules, in process: no broker, no socket (docs/architecture.md)."""

from __future__ import annotations

import uuid

import pytest

from crossintercom.errors import Code
from crossintercom.local_broker.delivery.outcomes import Refusal
from crossintercom.local_broker.delivery.resolve import Target, resolve, without_relay
from crossintercom.local_broker.sessions.registry import Snapshot
from crossintercom.models import Outcome, SessionInfo, fallback_alias

HERE = "alpha"


def session(
    name: str | None,
    host: str = HERE,
    *,
    online: bool = True,
    groups: tuple[str, ...] = ("default",),
) -> SessionInfo:
    return SessionInfo(id=str(uuid.uuid4()), host=host, name=name, online=online, groups=groups)


def run(
    target: str, local: list[SessionInfo], remote: list[SessionInfo], sender: str = "me"
) -> list[Target]:
    """Resolved by scanning and through the registry's index: both must give one answer."""
    snap = Snapshot.of(local, remote)

    def indexed() -> list[Target]:
        return resolve(
            target,
            sender,
            host=HERE,
            local=local,
            remote=remote,
            by_id=snap.by_id,
            by_name=snap.by_name,
        )

    try:
        scanned = resolve(target, sender, host=HERE, local=local, remote=remote)
    except Refusal as r:
        with pytest.raises(Refusal) as again:
            indexed()
        assert (again.value.code, again.value.message) == (r.code, r.message)
        raise
    assert indexed() == scanned
    return scanned


def refusal(target: str, local: list[SessionInfo], remote: list[SessionInfo]) -> Refusal:
    with pytest.raises(Refusal) as caught:
        run(target, local, remote)
    return caught.value


def test_a_bare_name_prefers_this_host() -> None:
    mine, theirs = session("worker"), session("worker", "beta")
    assert run("worker", [mine], [theirs]) == [Target(mine.id, HERE, "worker", True)]


def test_live_before_offline_on_this_host() -> None:
    away, live = session("worker", online=False), session("worker")
    assert [t.session_id for t in run("worker", [away, live], [])] == [live.id]


def test_an_offline_local_name_beats_a_live_remote_one() -> None:
    away, remote = session("worker", online=False), session("worker", "beta")
    assert [t.session_id for t in run("worker", [away], [remote])] == [away.id]


def test_other_hosts_when_not_here() -> None:
    remote = session("worker", "beta")
    assert run("worker", [], [remote]) == [Target(remote.id, "beta", "worker", False)]


def test_two_matches_at_the_first_matching_level_are_ambiguous_with_candidates() -> None:
    one, two = session("worker", "beta"), session("worker", "gamma")
    r = refusal("worker", [], [one, two])
    assert r.code == "ambiguous"
    assert r.outcome is Outcome.REFUSED
    assert "worker@beta" in r.message and "worker@gamma" in r.message
    assert one.id in r.message and two.id in r.message


def test_a_unique_match_at_an_earlier_level_wins_over_ambiguity_later() -> None:
    mine = session("worker")
    others = [session("worker", "beta"), session("worker", "gamma")]
    assert [t.session_id for t in run("worker", [mine], others)] == [mine.id]


def test_name_at_host() -> None:
    b, c = session("worker", "beta"), session("worker", "gamma")
    assert [t.session_id for t in run("worker@gamma", [], [b, c])] == [c.id]
    mine = session("worker")
    assert [t.session_id for t in run(f"worker@{HERE}", [mine], [b])] == [mine.id]
    assert refusal("worker@delta", [], [b, c]).code == "not_found"


def test_two_sessions_with_one_name_on_one_host_need_the_id() -> None:
    a, b = session("worker", "beta"), session("worker", "beta")
    r = refusal("worker@beta", [], [a, b])
    assert r.code == "ambiguous"
    assert a.id in r.message and b.id in r.message


def test_full_id_anywhere() -> None:
    remote = session(None, "beta")
    assert [t.session_id for t in run(remote.id, [], [remote])] == [remote.id]
    assert refusal(str(uuid.uuid4()), [], [remote]).code == "not_found"


def test_fallback_alias_of_an_unnamed_session() -> None:
    anon = session(None)
    assert [t.session_id for t in run(fallback_alias(anon.id), [anon], [])] == [anon.id]


def test_group_is_every_member_but_the_sender_on_every_host() -> None:
    sender = session("me", groups=("team",))
    local = [sender, session("a", groups=("team",)), session("b", groups=("other",))]
    remote = [session("c", "beta", groups=("team", "x"), online=False)]
    got = run("group:team", local, remote, sender=sender.id)
    assert sorted(t.name or "" for t in got) == ["a", "c"]
    assert {t.local for t in got} == {True, False}
    assert refusal("group:nobody", local, remote).code == "not_found"


def test_unknown_name_is_not_found() -> None:
    assert refusal("ghost", [session("worker")], []).code == "not_found"


def test_without_relay_a_remote_or_store_target_is_not_sent() -> None:
    miss = Refusal(Code.NOT_FOUND, "no session named 'x'")
    assert without_relay("x@beta", miss, host=HERE, has_store=False).outcome is Outcome.NOT_SENT
    assert without_relay("x", miss, host=HERE, has_store=True).code == "no_relay"
    assert without_relay("x", miss, host=HERE, has_store=False) is miss
    assert without_relay(f"x@{HERE}", miss, host=HERE, has_store=False) is miss
