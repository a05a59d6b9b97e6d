"""The glob dialect is git's (docs/agents.md#path-reservations): for generated globs over a
small alphabet of the characters that mean something to it (``[ ] * ? / ! \\ -``), the paths
``crossintercom.reservations.matches`` takes are exactly those real `git ls-files` takes with
the glob as a ``:(glob)`` pathspec, over a checkout of every one- and two-character name (but
for git's one difference: a directory's plain path covers what is in it there); and two globs
that match a common path always overlap."""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from crossintercom.reservations import BadGlob, matches, normalise, overlap

NAMES_OF = "ab[]*?!\\-"
GLOBS_OF = NAMES_OF + "/:^"


def _names() -> list[str]:
    one = list(NAMES_OF)
    return one + ["".join(p) for p in itertools.product(NAMES_OF, repeat=2)]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    """Every name as a directory, every name as a file in each: 8,100 paths."""
    top = tmp_path_factory.mktemp("globs")
    subprocess.run(["git", "init", "-q", str(top)], check=True)
    paths = []
    for d in _names():
        (top / d).mkdir()
        for f in _names():
            (top / d / f).touch()
            paths.append(f"{d}/{f}")
    yield top, paths


def _git(top: Path, glob: str) -> set[str]:
    done = subprocess.run(
        ["git", "-c", "core.ignorecase=false", "ls-files", "-o", "-z", "--", f":(glob){glob}"],
        cwd=top,
        capture_output=True,
        check=True,
    )
    return {p for p in done.stdout.decode().split("\0") if p}


def _glob(raw: str) -> str:
    try:
        return normalise(raw)
    except BadGlob:
        assume(False)
        raise


GLOBS = st.text(alphabet=GLOBS_OF, min_size=1, max_size=9)
COMMON = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@COMMON
@given(GLOBS)
@example("[a]/*")
@example("a[b")
@example("*/[!a]")
@example("**/[[:alpha:]]")
@example("[]]/\\*")
@example("a/**")
@example("**/b")
@example("[a-]/?")
@example("[\\]]/[^-]")
def test_matches_what_git_matches(checkout: tuple[Path, list[str]], raw: str) -> None:
    top, paths = checkout
    glob = _glob(raw)
    # git's one difference: a directory's plain path covers what is in it (ours: its path
    # only), so what is under the glob's own spelling is left out of the comparison
    under = glob + "/"
    ours = {p for p in paths if matches(glob, p) and not p.startswith(under)}
    assert ours == {p for p in _git(top, glob) if not p.startswith(under)}, glob


@COMMON
@given(GLOBS, GLOBS)
def test_globs_that_match_a_common_path_overlap(
    checkout: tuple[Path, list[str]], a: str, b: str
) -> None:
    _, paths = checkout
    x, y = _glob(a), _glob(b)
    if any(matches(x, p) and matches(y, p) for p in paths):
        assert overlap(x, y), (x, y)
