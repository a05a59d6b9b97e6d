"""Path reservations, the pure part (docs/agents.md#path-reservations): what a glob is, when two
globs can name one path, and which held reservations a new one (or a change to some paths)
conflicts with. No I/O: the store runs ``conflicts`` inside the reserving transaction, the CLI's
pre-commit check runs it over paths.

Globs are relative to the repository's top directory, ``/``-separated: ``*`` and ``?`` stay
within one path segment, ``**`` as a whole segment spans any number of them (``src/**``,
``**/*.py``), a trailing ``/`` means everything under a directory. A bracket class (``[ab]``)
is taken as any one character of a segment: two globs that differ only there are judged to
overlap, which errs on the side of a conflict.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Mode = Literal["exclusive", "shared"]
MODES: tuple[Mode, ...] = ("exclusive", "shared")
MAX_GLOB = 500

# A transition's label: one literal character, any character of a segment (not ``/``), or any.
_SEG = "\x00seg"
_ANY = "\x00any"


class BadGlob(ValueError):
    """A glob that names nothing inside the repository."""


def normalise(glob: str) -> str:
    """``glob`` in its stored form; ``BadGlob`` when it is absolute, climbs out (``..``), is
    empty or too long."""
    g = glob.strip()
    while g.startswith("./"):
        g = g[2:]
    if g.endswith("/"):
        g += "**"
    if not g or len(g) > MAX_GLOB:
        raise BadGlob(f"a glob is 1 to {MAX_GLOB} characters: {glob[:80]!r}")
    if g.startswith("/") or "\\" in g:
        raise BadGlob(f"a glob is relative to the repository's top, with '/': {glob!r}")
    parts = g.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BadGlob(f"a glob has no empty, '.' or '..' segment: {glob!r}")
    if any(ord(c) < 32 for c in g):
        raise BadGlob("a glob holds no control characters")
    return g


@dataclass(frozen=True, slots=True)
class _Nfa:
    # state -> [(label, next state)]; state -> [next state] without a character.
    steps: tuple[tuple[tuple[str, int], ...], ...]
    skips: tuple[tuple[int, ...], ...]
    accept: int


def _compile(pattern: str, *, literal: bool = False) -> _Nfa:
    steps: list[list[tuple[str, int]]] = [[]]
    skips: list[list[int]] = [[]]

    def new() -> int:
        steps.append([])
        skips.append([])
        return len(steps) - 1

    s, i, n = 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        at_segment_start = i == 0 or pattern[i - 1] == "/"
        if literal:
            t = new()
            steps[s].append((c, t))
            s, i = t, i + 1
        elif c == "*" and pattern.startswith("**", i) and at_segment_start:
            after = i + 2
            t = new()
            steps[s].append((_ANY, s))
            if after < n and pattern[after] == "/":
                # "**/": nothing, or anything that ends in "/".
                steps[s].append(("/", t))
                skips[s].append(t)
                i = after + 1
            else:
                skips[s].append(t)
                i = after
            s = t
        elif c == "*":
            while i < n and pattern[i] == "*":
                i += 1
            t = new()
            steps[s].append((_SEG, s))
            skips[s].append(t)
            s = t
        elif c == "?" or (c == "[" and "]" in pattern[i + 2 :]):
            t = new()
            steps[s].append((_SEG, t))
            i = pattern.index("]", i + 2) + 1 if c == "[" else i + 1
            s = t
        else:
            t = new()
            steps[s].append((c, t))
            s, i = t, i + 1
    return _Nfa(tuple(tuple(x) for x in steps), tuple(tuple(x) for x in skips), accept=s)


def _meet(a: str, b: str) -> bool:
    """Whether one character can carry both labels."""
    if _ANY in (a, b):
        return True
    if a == _SEG:
        return b != "/"
    if b == _SEG:
        return a != "/"
    return a == b


def _intersects(x: _Nfa, y: _Nfa) -> bool:
    """Whether some string takes both automata to their accepting states (the product's
    reachability, depth first)."""
    seen: set[tuple[int, int]] = set()
    todo = [(0, 0)]
    while todo:
        pair = todo.pop()
        if pair in seen:
            continue
        seen.add(pair)
        i, j = pair
        if i == x.accept and j == y.accept:
            return True
        todo += [(k, j) for k in x.skips[i]] + [(i, k) for k in y.skips[j]]
        todo += [(ni, nj) for la, ni in x.steps[i] for lb, nj in y.steps[j] if _meet(la, lb)]
    return False


def overlap(a: str, b: str) -> bool:
    """Whether some path matches both globs."""
    return _intersects(_compile(a), _compile(b))


def matches(glob: str, path: str) -> bool:
    """Whether ``path`` (repository-relative) matches ``glob``."""
    return _intersects(_compile(glob), _compile(path, literal=True))


@dataclass(frozen=True, slots=True)
class Held:
    """A reservation as the store holds it."""

    id: str
    project: str
    glob: str
    mode: Mode
    host: str
    session: str
    expires_at: float
    created: float
    reason: str | None = None
    name: str | None = None


def clashes(mode: Mode, other: Mode) -> bool:
    """Exclusive clashes with anything; shared only with exclusive."""
    return mode == "exclusive" or other == "exclusive"


def conflicts(
    held: Iterable[Held], session: str | None, globs: Sequence[str], mode: Mode
) -> list[Held]:
    """The reservations of other sessions (not ``session``) that reserving ``globs`` in
    ``mode`` clashes with, in the order given."""
    return [
        h
        for h in held
        if h.session != session and clashes(mode, h.mode) and any(overlap(g, h.glob) for g in globs)
    ]


def path_conflicts(
    held: Iterable[Held], session: str | None, paths: Sequence[str], mode: Mode = "shared"
) -> list[tuple[str, Held]]:
    """(path, reservation) for each path a change would make clash with another session's
    reservation: by default as a shared reservation of the path would (others' exclusive
    ones), with ``mode`` exclusive with any."""
    return [
        (p, h)
        for h in held
        if h.session != session and clashes(mode, h.mode)
        for p in paths
        if matches(h.glob, p)
    ]
