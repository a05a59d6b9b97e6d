r"""Path reservations, the pure part (docs/agents.md#path-reservations): what a glob is, when two
globs can name one path, and which held reservations a new one (or a change to some paths)
conflicts with. No I/O: the store runs ``conflicts`` inside the reserving transaction, the CLI's
pre-commit check runs it over paths.

Globs are relative to the repository's top directory, and match as git's pathspecs with glob
magic do (``git ls-files ':(glob)GLOB'``: git's wildmatch), with one exception: a glob matches
the path it spells, not what is under it when that is a directory (``src/`` or ``src/**``
says that). So: the path it spells, and what the pattern matches: ``*`` and ``?`` stay within
one path segment, ``**`` as a whole segment spans any number of them (``src/**``,
``**/*.py``), ``[...]`` is one character of a set (``[a-z]``, ``[!.]``, ``[[:digit:]]``),
``\`` makes the next character literal. So ``pages/[id].tsx`` covers the file of that name
(and ``pages/i.tsx``). A trailing ``/`` means everything under a directory. Characters, not
bytes: a non-ASCII character is one ``?`` here, several to git.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Mode = Literal["exclusive", "shared"]
MODES: tuple[Mode, ...] = ("exclusive", "shared")
MAX_GLOB = 500
MAX_REASON = 500

# Defaults of the quotas (settings ``reservation_*``, docs/agents.md#path-reservations): per
# session and per host, how many live reservations and how many characters of globs and
# reasons they hold; a host reads at most the per-host count of each other host's rows, and
# at most READ_LIMIT rows in one read (a list that had more says so).
PER_SESSION = 200
PER_SESSION_CHARS = 100_000
PER_HOST = 1000
PER_HOST_CHARS = 500_000
READ_LIMIT = 2000


@dataclass(frozen=True, slots=True)
class Quotas:
    per_session: int = PER_SESSION
    per_session_chars: int = PER_SESSION_CHARS
    per_host: int = PER_HOST
    per_host_chars: int = PER_HOST_CHARS


DEFAULT_QUOTAS = Quotas()

# A transition's label: one literal character, a bracket expression (``_Class``), any
# character of a segment (not ``/``), or any character.
_SEG = "\x00seg"
_ANY = "\x00any"

# The character classes of a bracket expression, ASCII as git's (``[[:alpha:]]``).
_ASCII = [chr(i) for i in range(128)]
_CLASS_TESTS: dict[str, Callable[[str], bool]] = {
    "alnum": str.isalnum,
    "alpha": str.isalpha,
    "blank": lambda c: c in " \t",
    "cntrl": lambda c: ord(c) < 32 or ord(c) == 127,
    "digit": str.isdigit,
    "graph": lambda c: 32 < ord(c) < 127,
    "lower": str.islower,
    "print": lambda c: 32 <= ord(c) < 127,
    "punct": lambda c: 32 < ord(c) < 127 and not c.isalnum(),
    "space": lambda c: c in " \t\n\r\v\f",
    "upper": str.isupper,
    "xdigit": lambda c: c in "0123456789abcdefABCDEF",
}
_CLASSES = {name: frozenset(filter(test, _ASCII)) for name, test in _CLASS_TESTS.items()}


class BadGlob(ValueError):
    """A glob that names nothing inside the repository."""


class _Abort(Exception):
    """git's wildmatch gives up on a pattern: it matches nothing as a pattern (only as the
    literal path it spells)."""


@dataclass(frozen=True, slots=True)
class _Class:
    """A bracket expression: its characters, ranges and classes, perhaps negated; never
    ``/`` (git matches a path's segments)."""

    negated: bool
    chars: frozenset[str]
    ranges: tuple[tuple[str, str], ...]

    def __contains__(self, c: object) -> bool:
        if c == "/":
            return False
        hit = c in self.chars or any(lo <= str(c) <= hi for lo, hi in self.ranges)
        return hit != self.negated

    def candidates(self) -> set[str]:
        """Characters that decide whether this class meets another: its own, its ranges'
        first ones, and the printable ASCII."""
        out = set(self.chars) | set(_ASCII[32:127])
        for lo, hi in self.ranges:
            out |= {chr(i) for i in range(ord(lo), min(ord(hi), ord(lo) + 256) + 1)}
        return out


def _bracket(p: str, i: int) -> tuple[_Class, int]:
    """The bracket expression opening at ``p[i]`` (git's wildmatch rules: ``!`` or ``^`` first
    negates, a ``]`` first is literal, ``a-z`` ranges, ``[:class:]``, ``\\`` escapes) and the
    index after its ``]``; ``_Abort`` where git's matcher gives up on the whole pattern (an
    unclosed ``[``, an unknown class)."""
    n = len(p)
    i += 1
    negated = i < n and p[i] in "!^"
    i += negated
    chars: set[str] = set()
    ranges: list[tuple[str, str]] = []
    prev: str | None = None
    first = True
    while True:
        if i >= n:
            raise _Abort
        c = p[i]
        if c == "]" and not first:
            return _Class(negated, frozenset(chars), tuple(ranges)), i + 1
        first = False
        if c == "\\":
            i += 1
            if i >= n:
                raise _Abort
            chars.add(p[i])
            prev = p[i]
        elif c == "-" and prev is not None and i + 1 < n and p[i + 1] != "]":
            i += 1
            hi = p[i]
            if hi == "\\":
                i += 1
                if i >= n:
                    raise _Abort
                hi = p[i]
            ranges.append((prev, hi))
            prev = None
        elif c == "[" and p.startswith(":", i + 1):
            end = p.find("]", i + 2)
            if end < 0:
                raise _Abort
            if end - (i + 2) < 1 or p[end - 1] != ":":
                chars.add("[")  # not "[:name:]": a plain '[' of the set
                prev = "["
            else:
                name = p[i + 2 : end - 1]
                if name not in _CLASSES:
                    raise _Abort
                chars |= _CLASSES[name]
                prev = None
                i = end
        else:
            chars.add(c)
            prev = c
        i += 1


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
    if g.startswith("/"):
        raise BadGlob(f"a glob is relative to the repository's top, with '/': {glob!r}")
    parts = g.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BadGlob(f"a glob has no empty, '.' or '..' segment: {glob!r}")
    if any(ord(c) < 32 for c in g):
        raise BadGlob("a glob holds no control characters")
    return g


Label = str | _Class


@dataclass(frozen=True, slots=True)
class _Nfa:
    # state -> [(label, next state)]; state -> [next state] without a character.
    steps: tuple[tuple[tuple[Label, int], ...], ...]
    skips: tuple[tuple[int, ...], ...]
    accept: int


@lru_cache(maxsize=4096)
def _wild(pattern: str) -> _Nfa | None:
    """The paths git's wildmatch (``WM_PATHNAME``) matches ``pattern`` against; None when it
    gives up on the pattern."""
    try:
        return _compile(pattern)
    except _Abort:
        return None


def _languages(glob: str) -> list[_Nfa]:
    """The glob as spelled (one path), and as a pattern when git takes it as one."""
    spelled = _compile(glob, literal=True)
    wild = _wild(glob)
    return [spelled] if wild is None else [spelled, wild]


@lru_cache(maxsize=4096)
def _compile(pattern: str, *, literal: bool = False) -> _Nfa:
    steps: list[list[tuple[Label, int]]] = [[]]
    skips: list[list[int]] = [[]]

    def new() -> int:
        steps.append([])
        skips.append([])
        return len(steps) - 1

    s, i, n = 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if literal:
            t = new()
            steps[s].append((c, t))
            s, i = t, i + 1
        elif c == "*":
            start = i
            while i < n and pattern[i] == "*":
                i += 1
            t = new()
            # git's "**": a whole segment of stars spans segments ("**/" also none at all);
            # elsewhere stars are one "*", within a segment.
            whole = (start == 0 or pattern[start - 1] == "/") and (
                i == n or pattern.startswith(("/", "\\/"), i)
            )
            if i - start >= 2 and whole and pattern.startswith("/", i):
                # "**/": nothing, or anything that ends in "/" (in a state of its own: the
                # "nothing" is only from where the stars start)
                loop = new()
                skips[s] += [loop, t]
                steps[loop] += [(_ANY, loop), ("/", t)]
                i += 1
            elif i - start >= 2 and whole:
                steps[s].append((_ANY, s))
                skips[s].append(t)
            else:
                steps[s].append((_SEG, s))
                skips[s].append(t)
            s = t
        elif c == "?":
            t = new()
            steps[s].append((_SEG, t))
            s, i = t, i + 1
        elif c == "[":
            label, i = _bracket(pattern, i)
            t = new()
            steps[s].append((label, t))
            s = t
        else:
            if c == "\\":
                i += 1
                if i == n:  # git compares the end of the pattern with a character: no match
                    raise _Abort
                c = pattern[i]
            t = new()
            steps[s].append((c, t))
            s, i = t, i + 1
    return _Nfa(tuple(tuple(x) for x in steps), tuple(tuple(x) for x in skips), accept=s)


@lru_cache(maxsize=4096)
def _meet(a: Label, b: Label) -> bool:
    """Whether one character can carry both labels."""
    if isinstance(a, _Class) or isinstance(b, _Class):
        found = (a.candidates() if isinstance(a, _Class) else set()) | (
            b.candidates() if isinstance(b, _Class) else set()
        )
        return any(_carries(a, c) and _carries(b, c) for c in found)
    if _ANY in (a, b):
        return True
    if a == _SEG:
        return b != "/"
    if b == _SEG:
        return a != "/"
    return a == b


def _carries(label: Label, c: str) -> bool:
    if isinstance(label, _Class):
        return c in label
    if label == _ANY:
        return True
    if label == _SEG:
        return c != "/"
    return label == c


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
    pa, pb = _lead(a), _lead(b)
    if not (pa.startswith(pb) or pb.startswith(pa)):
        return False  # every path either matches starts with its glob's literal lead
    return any(_intersects(x, y) for x in _languages(a) for y in _languages(b))


def _lead(glob: str) -> str:
    """The glob's characters before its first special one: what every path it matches (as
    spelled, or as a pattern) starts with. Comparing these first keeps most of a conflict
    check's pairs (``src/a/**`` against ``docs/**``) from building any automaton."""
    cut = next((i for i, c in enumerate(glob) if c in "*?[\\"), len(glob))
    return glob[:cut]


def matches(glob: str, path: str) -> bool:
    """Whether ``path`` (repository-relative) matches ``glob``: as spelled, or by git's
    wildmatch."""
    if path == glob:
        return True
    wild = _wild(glob)
    return wild is not None and _intersects(wild, _compile(path, literal=True))


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
    held: Iterable[Held],
    session: str | None,
    globs: Sequence[str],
    mode: Mode,
    host: str | None = None,
) -> list[Held]:
    """The reservations of other sessions (not ``session`` of ``host``; any host's when None)
    that reserving ``globs`` in ``mode`` clashes with, in the order given. A session id is
    one host's: another host's session of the same id is another session."""
    return [
        h
        for h in held
        if (h.session != session or host not in (None, h.host))
        and clashes(mode, h.mode)
        and any(overlap(g, h.glob) for g in globs)
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
