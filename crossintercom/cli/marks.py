"""``--priority``, ``--ack-required`` and ``--ack-within`` of send, ask and reply
(docs/delivery.md#priority, docs/delivery.md#acknowledgement)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from crossintercom.client import Marks
from crossintercom.models import PRIORITIES
from crossintercom.timeparse import parse_age

PRIORITY_HELP = "How much the message matters: low, normal (default), high or urgent."
ACK_HELP = "Ask the recipient to acknowledge it (`crossintercom ack ID`); a reply acknowledges."
ACK_WITHIN_HELP = "With --ack-required: overdue when not acknowledged within AGE (30m, 12h, 2d)."


def _age(_ctx: click.Context, _param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_age(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def mark_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds the options and hands the command one ``marks`` keyword (a ``Marks``)."""

    @functools.wraps(fn)
    def wrapper(
        *args: Any, priority: str, ack_required: bool, ack_within: int | None, **kw: Any
    ) -> Any:
        if ack_within is not None and not ack_required:
            raise click.UsageError("--ack-within needs --ack-required")
        marks = Marks(
            priority=next(p for p in PRIORITIES if p == priority),
            ack_required=ack_required,
            ack_within_s=ack_within,
        )
        return fn(*args, marks=marks, **kw)

    wrapper = click.option("--ack-within", metavar="AGE", callback=_age, help=ACK_WITHIN_HELP)(
        wrapper
    )
    wrapper = click.option("--ack-required", is_flag=True, help=ACK_HELP)(wrapper)
    return click.option(
        "--priority", type=click.Choice(PRIORITIES), default="normal", help=PRIORITY_HELP
    )(wrapper)
