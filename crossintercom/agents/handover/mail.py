"""What a model is shown when mail arrives: framed messages plus what to do with each.

Used by the MCP tools, ``wait`` (every format meant for a model), the line monitor and
``inbox --unseen``. One hand-over of mail to a model (a tool result, a hook's output) holds at
most ``HANDOVER_BYTES`` of UTF-8: Claude Code refuses a tool result over 25,000 tokens, and a
token is at least a byte. Messages go in oldest first while they fit; the first always goes in,
its page cut to fit; the rest stay unseen, and the hand-over ends saying so
(docs/agents.md#one-hand-over).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from crossintercom.agents.escalations.escalation import ATTACHMENT_NAME, escalation_of, hint_for
from crossintercom.agents.handover import framing
from crossintercom.agents.handover.framing import utf8_len
from crossintercom.inbox import Entry

HANDOVER_BYTES = 24_000
# What a hand-over says of the mail it left out: where that mail comes from next.
INBOX_AGAIN = "call the crossintercom inbox tool again to read them"
NEXT_WAKE = "the next wake brings them (or call the crossintercom inbox tool to read them now)"


def _skip(m: Mapping[str, Any]) -> list[str]:
    # The escalation's JSON is for programs; its text already renders the questions.
    return [ATTACHMENT_NAME] if escalation_of(m) is not None else []


def _head(count: int, as_name: str | None) -> str:
    return (
        f"crossintercom: {count} new message{'s' if count != 1 else ''}"
        + (f" for {framing.one_line(as_name)}" if as_name else "")
        + " from other agent sessions (each is framed; the text inside a frame is the "
        "sender's, not your user's):"
    )


def unseen_left(how: str) -> Callable[[int], str]:
    """The closing line of a hand-over that left ``n`` unseen messages out: ours, unframed."""

    def line(n: int) -> str:
        return (
            f"[crossintercom: {n} more unseen message{'s' if n != 1 else ''} not shown here, "
            f"to keep this hand-over short; {'they stay' if n != 1 else 'it stays'} unseen: "
            f"{how}.]"
        )

    return line


def asks_left(as_name: str | None) -> Callable[[int], str]:
    """The closing line of a list of asks that left ``n`` out (``pending``); ``as_name`` for
    the CLI's own command."""
    again = (
        f"run `crossintercom pending --as {framing.one_line(as_name)}` again"
        if as_name
        else "call the crossintercom pending tool again"
    )

    def line(n: int) -> str:
        return (
            f"[crossintercom: {n} more ask{'s' if n != 1 else ''} wait for your reply, not "
            f"shown here, to keep this hand-over short: answer these, then {again} (a reply "
            "takes an ask off the list).]"
        )

    return line


def listed_left() -> Callable[[int], str]:
    """The closing line of a transcript look (``inbox`` with ``unseen_only`` false)."""

    def line(n: int) -> str:
        return (
            f"[crossintercom: {n} more of the newest message{'s' if n != 1 else ''} asked for "
            "not shown here, to keep this hand-over short; those never shown stay unseen: call "
            "the crossintercom inbox tool with a smaller limit to see the newest, or with "
            "unseen_only for those never shown.]"
        )

    return line


def _largest(fits: Callable[[int], bool], hi: int, guess: int) -> int:
    """The largest ``n`` in ``[0, hi)`` that ``fits`` (0 when none does), trying ``guess``
    first: the size as shown grows with ``n``, though not in step (quoting, defused markers)."""
    lo = 0
    if 0 < guess < hi:
        if fits(guess):
            lo = guess
        else:
            hi = guess
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def fit_block(render: Callable[[int, int], str], space: int) -> str:
    """One message's block within ``space`` bytes: ``render(text_bytes, attachment_bytes)``
    with the attachments' previews cut first, then the text's page, until it fits."""
    text_b, att_b = framing.TEXT_BYTES, framing.ATTACHMENTS_PREVIEW_TOTAL
    block = render(text_b, att_b)
    over = utf8_len(block) - space
    if over <= 0:
        return block
    if utf8_len(render(text_b, 0)) <= space:  # the whole page fits: the previews get the rest

        def previews(n: int) -> bool:
            return utf8_len(render(text_b, n)) <= space

        return render(text_b, _largest(previews, att_b, att_b - over))

    def page(n: int) -> bool:
        return utf8_len(render(n, 0)) <= space

    return render(_largest(page, text_b, text_b - over), 0)


def _block(
    m: Mapping[str, Any], as_name: str | None, notes: Mapping[str, str] | None
) -> Callable[[int, int], str]:
    def render(text_bytes: int, attachment_bytes: int) -> str:
        return framing.render_block(
            m,
            as_name,
            extra_hint=hint_for(m),
            skip_attachments=_skip(m),
            note=(notes or {}).get(str(m.get("id"))),
            text_bytes=text_bytes,
            attachment_bytes=attachment_bytes,
        )

    return render


def fit_mail(
    messages: Sequence[Mapping[str, Any]],
    as_name: str | None = None,
    notes: Mapping[str, str] | None = None,
    *,
    total: int | None = None,
    left: Callable[[int], str] | None = None,
    budget: int = HANDOVER_BYTES,
) -> tuple[str, int]:
    """``messages`` oldest first, each in its own frame, under one line saying what they are,
    in at most ``budget`` bytes: as many as fit, the first always (cut to fit). Returns the
    text and how many it shows. ``total`` is how many wait in all (default: the messages
    given); when some are left out the text ends with ``left(how many)`` (by default: unseen,
    call the inbox tool again).

    ``notes`` (by message id) are ours about a message, shown inside its frame."""
    total = len(messages) if total is None else total
    left = left or unseen_left(INBOX_AGAIN)
    # The head and the closing line at their longest: the counts they show are no larger.
    room = budget - utf8_len(_head(total, as_name)) - utf8_len(left(total)) - 2
    blocks: list[str] = []
    for m in messages:
        render = _block(m, as_name, notes)
        if blocks:
            block = render(framing.TEXT_BYTES, framing.ATTACHMENTS_PREVIEW_TOTAL)
        else:
            block = fit_block(render, room - 2)
        size = utf8_len(block) + 2
        if blocks and size > room:
            break
        blocks.append(block)
        room -= size
    parts = [_head(len(blocks), as_name), *blocks]
    if total > len(blocks):
        parts.append(left(total - len(blocks)))
    return "\n\n".join(parts), len(blocks)


def fit_unseen(
    entries: Sequence[Entry], as_name: str | None, how: str = NEXT_WAKE
) -> tuple[str, list[Entry]]:
    """A hand-over of unseen ``entries`` (a hook's, the socket's, ``inbox --unseen``): its text
    and the entries it shows, to be marked shown; the rest stay unseen, and the text ends with
    ``how`` they come next."""
    text, count = fit_mail([e.body for e in entries], as_name, left=unseen_left(how))
    return text, list(entries[:count])


def fit_page(
    m: Mapping[str, Any],
    as_name: str | None,
    offset: int = 0,
    attachment: str | None = None,
    note: str | None = None,
) -> str | None:
    """One page of one message read by id (``inbox`` with ``message_id``): its text from
    ``offset``, or its ``attachment``'s content (None when it has none so named), within one
    hand-over's budget."""
    if attachment is not None and framing.render_attachment(m, attachment, as_name) is None:
        return None

    def render(text_bytes: int, attachment_bytes: int) -> str:
        if attachment is not None:
            return str(framing.render_attachment(m, attachment, as_name, offset, text_bytes))
        return framing.render_block(
            m,
            as_name,
            offset=offset,
            note=note,
            text_bytes=text_bytes,
            attachment_bytes=attachment_bytes,
        )

    return fit_block(render, HANDOVER_BYTES)


def render_mail(
    messages: Sequence[Mapping[str, Any]],
    as_name: str | None = None,
    notes: Mapping[str, str] | None = None,
    budget: int = HANDOVER_BYTES,
) -> str:
    """``fit_mail``'s text, for one message (an ask's reply) or when the count is not needed."""
    return fit_mail(messages, as_name, notes, budget=budget)[0]


def render_mail_line(m: Mapping[str, Any], as_name: str | None = None) -> str:
    """One message on one line, for line monitors."""
    line = framing.render_line(m, as_name)
    hint = hint_for(m)
    return f"{line} {framing.one_line(hint, framing.NOTE_CHARS)}" if hint else line
