"""The pure rules of path reservations: globs, overlap, conflicts by mode."""

from __future__ import annotations

import pytest

from crossintercom.reservations import (
    BadGlob,
    Held,
    conflicts,
    matches,
    normalise,
    overlap,
    path_conflicts,
)
from crossintercom.storage import HostRow, LeaseTracker


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("src/**", "src/x.py", True),
        ("src/**", "src/a/b/c.py", True),
        ("src/**", "docs/x.md", False),
        ("src/*.py", "src/a/b.py", False),
        ("src/*.py", "src/**/b.py", True),
        ("**/*.py", "x.py", True),
        ("**/*.py", "a/b/x.md", False),
        ("*.md", "README.md", True),
        ("a?c", "abc", True),
        ("a?c", "a/c", False),
        ("src/[ab].py", "src/c.py", False),  # a class is its characters, as in git
        ("src/[ab].py", "src/[a-c].py", True),
        ("src/[!ab].py", "src/a.py", False),
        ("pages/[id].tsx", "pages/[id].tsx", True),
        ("pages/[id].tsx", "pages/i.tsx", True),
        ("src/**/test_*.py", "src/*/test_a.*", True),
        ("src/x.py", "src/x.py", True),
        ("src/x.py", "src/y.py", False),
        ("a*b*c", "a*c", True),
        ("**", "anything/at/all", True),
    ],
)
def test_overlap(a: str, b: str, expected: bool) -> None:
    assert overlap(a, b) is expected
    assert overlap(b, a) is expected


def test_matches_a_path_literally() -> None:
    assert matches("src/**", "src/x.py") and not matches("src/**", "srcx.py")
    assert not matches("src/x.py", "src/*")  # a path's '*' is a character, not a wildcard
    assert matches("docs/*.md", "docs/agents.md") and not matches("docs/*.md", "docs/a/b.md")


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../x", "a/../b", "a//b", "x" * 501])
def test_bad_globs(bad: str) -> None:
    with pytest.raises(BadGlob):
        normalise(bad)


def test_normalise() -> None:
    assert normalise("./src/") == "src/**" and normalise(" docs/*.md ") == "docs/*.md"


def _held(session: str, glob: str, mode: str) -> Held:
    return Held(f"id-{session}-{glob}", "p", glob, mode, "h", session, 0.0, 0.0)  # type: ignore[arg-type]


def test_conflicts_by_mode_and_holder() -> None:
    held = [_held("a", "src/**", "exclusive"), _held("b", "docs/**", "shared")]
    assert [h.session for h in conflicts(held, "c", ["src/x.py"], "shared")] == ["a"]
    assert [h.session for h in conflicts(held, "c", ["docs/a.md"], "exclusive")] == ["b"]
    assert conflicts(held, "c", ["docs/a.md"], "shared") == []
    assert conflicts(held, "a", ["src/x.py"], "exclusive") == []  # one's own never clashes
    found = path_conflicts(held, None, ["src/x.py", "docs/a.md", "README"])
    assert [(p, h.session) for p, h in found] == [("src/x.py", "a")]
    found = path_conflicts(held, None, ["docs/a.md"], "exclusive")
    assert [(p, h.session) for p, h in found] == [("docs/a.md", "b")]


def test_lapsed_hosts_are_those_seen_whose_counter_stood_still() -> None:
    now = [0.0]
    leases = LeaseTracker(lease_s=10, clock=lambda: now[0], heartbeat_s=1)
    leases.observe([HostRow("A", 1, 1), HostRow("B", 1, 1)])
    now[0] = 11.0
    leases.observe([HostRow("A", 1, 2), HostRow("B", 1, 1)])
    assert leases.lapsed_hosts() == {"B"}  # a host never seen is not counted lapsed


def test_a_bracketed_file_name_is_covered_by_its_own_reservation() -> None:
    """Next.js, SvelteKit and Nuxt name routes `pages/[id].tsx`: a reservation of that name
    clashes with a change to that file, as `git add 'pages/[id].tsx'` takes that file."""
    held = [_held("other", "pages/[id].tsx", "exclusive")]
    assert [p for p, _ in path_conflicts(held, "me", ["pages/[id].tsx", "pages/x.tsx"])] == [
        "pages/[id].tsx"
    ]
    assert matches(r"pages/\[id\].tsx", "pages/[id].tsx")
    assert not matches(r"pages/\[id\].tsx", "pages/i.tsx")
