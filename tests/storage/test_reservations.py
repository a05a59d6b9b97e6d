"""Path reservations in the store, on every backend: all-or-none reserves that clash by mode,
renewal, release, and the reservations that stop counting (TTL, a newer generation, a session
off the roster or forgotten, a host the reader judges lapsed)."""

from __future__ import annotations

import asyncio
from typing import Any

from crossintercom.models import SessionInfo
from crossintercom.storage import MailboxStore, open_store
from crossintercom.storage.blocking import run

P = "git.example.org/team/app"


def _hosts(store: MailboxStore) -> tuple[int, int]:
    g1, g2 = run(store.claim_host("h1")), run(store.claim_host("h2"))
    for host, gen, sessions in (("h1", g1, ("a", "a2")), ("h2", g2, ("b",))):
        rows = [SessionInfo(id=s, host=host, name=f"n-{s}", durable=True) for s in sessions]
        assert run(store.publish_sessions(host, gen, rows))
    return g1, g2


def _reserve(store: MailboxStore, host: str, gen: int, session: str, *globs: str, **kw: Any) -> Any:
    args: dict[str, Any] = {"mode": "exclusive", "ttl_s": 600, "reason": None, **kw}
    return run(store.reserve(host, gen, project=P, session_id=session, globs=list(globs), **args))


def test_reserve_clashes_by_mode_and_is_all_or_none(store: MailboxStore) -> None:
    g1, g2 = _hosts(store)
    made = _reserve(store, "h1", g1, "a", "src/**", reason="refactor")
    assert made.conflicts == [] and [(h.glob, h.name, h.reason) for h in made.held] == [
        ("src/**", "n-a", "refactor")
    ]
    refused = _reserve(store, "h2", g2, "b", "docs/x.md", "src/x.py")
    assert [h.glob for h in refused.conflicts] == ["src/**"] and refused.held == []
    assert [h.glob for h in run(store.reservations(P))] == ["src/**"]  # nothing of b's
    # shared with shared coexist; shared with exclusive does not
    assert _reserve(store, "h2", g2, "b", "docs/**", mode="shared").conflicts == []
    assert _reserve(store, "h1", g1, "a2", "docs/a.md", mode="shared").conflicts == []
    assert [h.session for h in _reserve(store, "h1", g1, "a2", "docs/b.md").conflicts] == ["b"]
    # the same session never clashes with itself; reserving again renews
    again = _reserve(store, "h1", g1, "a", "src/**", mode="shared", ttl_s=60)
    assert [(h.glob, h.mode) for h in again.held] == [("src/**", "shared")]
    # another project is another namespace
    assert run(store.reservations("elsewhere")) == []
    assert len(run(store.reservations())) == 3


def test_release_and_what_stops_counting(store: MailboxStore) -> None:
    g1, g2 = _hosts(store)
    _reserve(store, "h1", g1, "a", "src/**")
    _reserve(store, "h1", g1, "a", "lib/**")
    _reserve(store, "h1", g1, "a2", "old/**", ttl_s=0)
    _reserve(store, "h2", g2, "b", "docs/**")
    assert sorted(h.glob for h in run(store.reservations(P))) == ["docs/**", "lib/**", "src/**"]
    # a host the reader judges lapsed
    assert [h.glob for h in run(store.reservations(P, lapsed={"h1"}))] == ["docs/**"]
    # release: some, then all; another host's session is not this host's to release
    rel = {"project": P, "session_id": "a"}
    assert run(store.release("h1", g1, globs=["lib/**"], **rel)) == 1
    assert run(store.release("h2", g2, globs=None, **rel)) == 0
    assert run(store.release("h1", g1 + 5, globs=None, **rel)) is None  # stale
    # forgotten: b's go with it
    run(store.forget_session("h2", g2, "b"))
    assert [h.glob for h in run(store.reservations(P))] == ["src/**"]
    # a newer generation (a relay restart) ends what the old one made; a stale reserve fails
    g1b = run(store.claim_host("h1"))
    assert run(store.reservations(P)) == []
    assert _reserve(store, "h1", g1, "a", "x/**") is None
    assert run(store.sweep_reservations("h1", g1b)) == 2  # src/** and old/** (TTL 0)
    assert run(store.sweep_reservations("h1", g1)) == 0  # stale: nothing


def test_concurrent_overlapping_reserves_one_wins(store: MailboxStore, store_url: str) -> None:
    """Two hosts' relays (two stores, two connections) reserve overlapping globs at once: the
    project's lock (PostgreSQL) or the file's write lock (SQLite) lets exactly one in."""
    g1, g2 = _hosts(store)
    other = run(open_store(store_url))
    try:

        async def race(n: int) -> list[Any]:
            kw: dict[str, Any] = {"project": P, "mode": "exclusive", "ttl_s": 600, "reason": None}
            return list(
                await asyncio.gather(
                    store.reserve("h1", g1, session_id="a", globs=[f"r{n}/**"], **kw),
                    other.reserve("h2", g2, session_id="b", globs=[f"r{n}/x.py"], **kw),
                )
            )

        for n in range(6):
            first, second = run(race(n))
            assert [bool(first.conflicts), bool(second.conflicts)].count(True) == 1, n
        assert len(run(store.reservations(P))) == 6
    finally:
        run(other.aclose())
