"""Text another session or host controls, made safe to show a model or a terminal.

One neutraliser for every surface (docs/agents.md#framing): the MCP tools, the hooks, the line
monitor, ``inbox --unseen`` and the CLI's listings all pass remote text through here.

- ``neutralise``: for a model. Escape sequences, control and format characters (Unicode
  categories Cc and Cf: bidi controls, zero-width characters, U+2060, U+FEFF, U+00AD, the tag
  characters U+E0000-E007F) and surrogates are dropped; every kind of line break becomes
  ``\\n``; the frame's own markers (``<<<``, ``>>>``, ``«``, ``»``) and tag-like sequences such
  as ``</system-reminder>`` are defused into lookalikes that read the same but mark nothing.
- ``one_line``: a header field (name, status, subject, id, cwd ...): neutralised, flattened and
  capped.
- ``for_terminal``: for a person's terminal: escape sequences and controls dropped, the text
  otherwise as sent.
- ``is_one_line``: the check at the door for fields documented as one line.
"""

from __future__ import annotations

import functools
import re
import unicodedata

MARK_OPEN = "<<<"
MARK_CLOSE = ">>>"
# The line form's quote marks: a sender's own become plain double quotes.
QUOTE_OPEN = "\u00ab"
QUOTE_CLOSE = "\u00bb"
# What the markers become: single angle quotation marks, readable and never a frame.
DEFUSED_OPEN = "\u2039"
DEFUSED_CLOSE = "\u203a"
# How long a one-line field may get when shown (a status or subject is a headline).
ONE_LINE_CHARS = 200

# ESC sequences as terminals read them (CSI, OSC/DCS/SOS/PM/APC strings, two-character
# escapes) and their C1 forms; whatever control is left after them is dropped one by one.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"
    r"|\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
    r"|\x9b[0-?]*[ -/]*[@-~]?"
    r"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
)
# Anything outside printable ASCII is looked at one character at a time.
_CANDIDATE = re.compile(r"[^\x20-\x7e\n]")
# Angle brackets of other scripts and forms (fullwidth, small, modifier letters, CJK, math):
# a model may read them as the ASCII ones, so they are taken as those and defused with them.
_LOOKALIKES = str.maketrans(
    {
        **dict.fromkeys("\uff1c\ufe64\u02c2\u2329\u3008\u27e8\u276e\u1438", "<"),
        **dict.fromkeys("\uff1e\ufe65\u02c3\u232a\u3009\u27e9\u276f\u1433", ">"),
        **dict.fromkeys("\u226a\u300a", "<<"),
        **dict.fromkeys("\u226b\u300b", ">>"),
    }
)
_MARKERS = re.compile(r"<{3,}|>{3,}")
# A tag as harnesses write them (<system-reminder>, </tool_result>, <!-- ...): defused whole.
# Any letter counts, spaces and a slash may come first: a model reads ``< /system-reminder>`` too.
# A fullwidth or other slash reads as one; ``<|im_start|>`` and ``<_x>`` are tags too.
_TAG = re.compile(r"<(\s*[/\uff0f\u2215\u2044\u29f8]?\s*(?:[^\W\d]|[!?|])[^<>]*)(>?)")
_DROPPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
# Unicode's Default_Ignorable_Code_Point characters outside those categories: shown as nothing
# or as a blank, yet a mark (U+034F, a variation selector) splits ``<<<`` or ``</tag>`` so it is
# not recognised, and a filler letter (U+3164) stands for a space inside a header field.
_IGNORABLE = (
    (0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2065, 0x2065),
    (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0xE0000, 0xE0FFF),
)  # fmt: skip
# What a combining mark after it would hide from the marker and tag patterns.
_MARK_BASES = "<>/\u00ab\u00bb"
_MARKED = re.compile(f"([{_MARK_BASES}])([^\\x00-\\x7f]+)")


@functools.lru_cache(maxsize=4096)
def _dropped(char: str) -> bool:
    code = ord(char)
    return (
        any(low <= code <= high for low, high in _IGNORABLE)
        or unicodedata.category(char) in _DROPPED_CATEGORIES
    )


def is_ignorable(char: str) -> bool:
    """A character shown as nothing (or as a blank that is not a space): no identifier holds one."""
    return _dropped(char) or unicodedata.category(char) in ("Zs", "Cn", "Co")


def _unmark(match: re.Match[str]) -> str:
    """A marker character with the combining marks after it dropped (the rest of the run kept)."""
    rest = match.group(2)
    start = 0
    while start < len(rest) and unicodedata.category(rest[start]).startswith("M"):
        start += 1
    return match.group(1) + rest[start:]


def _clean_char(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\t":
        return " "
    return "" if _dropped(char) else char


def _strip(text: str) -> str:
    """Line breaks normalised to '\\n', escape sequences and invisible characters dropped."""
    text = "\n".join(text.splitlines())  # \r, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029
    text = _ESCAPES.sub("", text)
    return _CANDIDATE.sub(_clean_char, text)


def _defuse_marker(match: re.Match[str]) -> str:
    run = match.group()
    return (DEFUSED_OPEN if run[0] == "<" else DEFUSED_CLOSE) * len(run)


def _defuse_tag(match: re.Match[str]) -> str:
    return DEFUSED_OPEN + match.group(1) + (DEFUSED_CLOSE if match.group(2) else "")


def neutralise(text: str) -> str:
    """Text from the wire, fit to stand inside a frame a model reads (lines kept, as '\\n')."""
    text = _strip(str(text)).translate(_LOOKALIKES)
    text = _MARKED.sub(_unmark, text)
    text = _MARKERS.sub(_defuse_marker, text)
    text = _TAG.sub(_defuse_tag, text)
    return text.replace(QUOTE_OPEN, '"').replace(QUOTE_CLOSE, '"')


def capped(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, an ellipsis saying it was."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def one_line(value: object, limit: int = ONE_LINE_CHARS) -> str:
    """A field shown on one line: neutralised, line breaks as spaces, at most ``limit`` chars."""
    return capped(" ".join(neutralise(str(value)).split()), limit)


def quoted(value: object, limit: int = ONE_LINE_CHARS) -> str:
    """A one-line field in the line form's quote marks: where another session's words start
    and end, whatever they hold (its own quote marks become plain double quotes)."""
    return f"{QUOTE_OPEN}{one_line(value, limit)}{QUOTE_CLOSE}"


def for_terminal(text: object) -> str:
    """Text for a person's terminal: no escape sequences, no controls, no bidi tricks."""
    return _strip(str(text))


def terminal_line(value: object, limit: int = ONE_LINE_CHARS) -> str:
    """A one-line field for a terminal (a table cell, a header)."""
    return capped(" ".join(for_terminal(value).split()), limit)


def is_one_line(text: str) -> bool:
    """No line break and no control character: what a one-line field must be when it enters."""
    return not any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)
