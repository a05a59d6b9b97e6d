"""`crossintercom escalate decision|interview|progress|answer` (docs/agents.md#escalations)."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click

from crossintercom.agents.answered import answered
from crossintercom.agents.escalations import supervisor as sup
from crossintercom.agents.escalations.escalation import Escalation, EscalationError, answer_note
from crossintercom.agents.handover.mail import render_mail
from crossintercom.cli.common import (
    FiniteRange,
    as_options,
    identity,
    json_option,
    one_shot,
    read_stdin_text,
    settings,
)
from crossintercom.cli.inbox_cmd import show_ids
from crossintercom.cli.output import emit_json, result_exit
from crossintercom.client import MAX_ASK_TIMEOUT_S
from crossintercom.exits import EXIT_NO_REPLY, EXIT_OK, OUTCOME_EXIT
from crossintercom.safetext import terminal_line

to_option = click.option(
    "--to",
    "--supervisor",
    "target",
    required=True,
    metavar="TARGET",
    help="The supervisor: NAME, NAME@HOSTID or a session id.",
)
timeout_option = click.option(
    "--timeout",
    type=FiniteRange(0, MAX_ASK_TIMEOUT_S, min_open=True),
    default=MAX_ASK_TIMEOUT_S,
    show_default=True,
    metavar="S",
    help="Seconds to wait for the answer (exit 6 when none comes in time).",
)


def _json_arg(raw: str, what: str) -> Any:
    if raw == "-":
        raw = read_stdin_text()
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise click.UsageError(f"{what} is not JSON: {exc}") from None


def _finish(result: sup.EscalationResult, as_json: bool) -> NoReturn:
    if OUTCOME_EXIT[result.sent.outcome] != EXIT_OK:
        result_exit(result.sent, as_json)
    if as_json:
        emit_json(result.to_dict())
    else:
        click.echo(f"{result.sent.outcome.value} {terminal_line(result.sent.id)}")
        reply = result.sent.reply
        if result.answer is not None and reply is not None:
            # The answer is another session's words, and an agent in a shell reads this: the
            # reply framed as the MCP escalate tools show it, the check as our note inside.
            note = "The answer, as checked: " + answer_note(result.answer.to_dict())
            click.echo(render_mail([reply.to_dict()], notes={reply.id: note}))
    if result.escalation.blocking and result.answer is None:
        if not as_json:
            click.echo("no answer before the timeout; it will arrive in the inbox", err=True)
        sys.exit(EXIT_NO_REPLY)
    sys.exit(EXIT_OK)


def _run(
    as_name: str, session_id: str | None, target: str, esc: Escalation, timeout: float
) -> sup.EscalationResult:
    cfg = settings()
    with one_shot(cfg, identity(cfg, as_name, session_id)) as client:
        return client.run(lambda c: sup.escalate(c, target, esc, timeout=timeout))


def _checked(build: Any) -> Escalation:
    try:
        esc: Escalation = build()
    except EscalationError as exc:
        raise click.UsageError(exc.message + "; nothing was sent") from None
    return esc


@click.group()
def escalate() -> None:
    """Ask a supervisor for a decision or an interview, report progress, answer one."""


@escalate.command()
@as_options(required=True)
@to_option
@click.option("--option", "options", multiple=True, metavar="CHOICE", help="A choice (repeat).")
@click.option("--context", metavar="TEXT", help="What the supervisor should know.")
@timeout_option
@json_option
@click.argument("question")
def decision(
    as_name: str,
    session_id: str | None,
    target: str,
    options: tuple[str, ...],
    context: str | None,
    timeout: float,
    as_json: bool,
    question: str,
) -> None:
    """Ask TARGET for a decision on QUESTION and wait for it (need_decision)."""
    esc = _checked(lambda: Escalation.decision(question, options, context))
    _finish(_run(as_name, session_id, target, esc, timeout), as_json)


@escalate.command()
@as_options(required=True)
@to_option
@click.option("--title", metavar="TEXT", help="What the interview is about.")
@timeout_option
@json_option
@click.argument("questions", metavar="QUESTIONS_JSON")
def interview(
    as_name: str,
    session_id: str | None,
    target: str,
    title: str | None,
    timeout: float,
    as_json: bool,
    questions: str,
) -> None:
    """Ask TARGET structured questions and wait (interview_request).

    QUESTIONS_JSON ('-' reads standard input) is a list of {"id", "type": single|multi|text|
    info, "question", "options"?, "context"?}.
    """
    raw = _json_arg(questions, "QUESTIONS_JSON")
    esc = _checked(lambda: Escalation.interview(raw, title))
    _finish(_run(as_name, session_id, target, esc, timeout), as_json)


@escalate.command()
@as_options(required=True)
@to_option
@click.option("--percent", type=FiniteRange(0, 100), help="How much is done.")
@click.option("--details", metavar="TEXT", help="More detail.")
@json_option
@click.argument("summary")
def progress(
    as_name: str,
    session_id: str | None,
    target: str,
    percent: float | None,
    details: str | None,
    as_json: bool,
    summary: str,
) -> None:
    """Tell TARGET how the work goes; nothing is awaited (progress_update)."""
    esc = _checked(lambda: Escalation.progress(summary, percent, details))
    _finish(_run(as_name, session_id, target, esc, 1.0), as_json)


@escalate.command()
@as_options(required=True)
@click.option("--reply-to", required=True, metavar="ID", help="The escalation to answer.")
@json_option
@click.argument("responses", metavar="RESPONSES_JSON")
def answer(
    as_name: str, session_id: str | None, reply_to: str, as_json: bool, responses: str
) -> None:
    """Answer an escalation delivered to NAME; it is checked against its questions first.

    RESPONSES_JSON ('-' reads standard input): {"responses": [{"id", "value"}]}, a bare list
    of {"id", "value"}, or an object {id: value}.
    """
    raw = _json_arg(responses, "RESPONSES_JSON")
    if isinstance(raw, dict) and "responses" in raw:
        raw = raw["responses"]
    cfg = settings()
    ident = identity(cfg, as_name, session_id)
    with one_shot(cfg, ident) as client:
        try:
            result = client.run(lambda c: sup.answer(c, reply_to, raw))
        except EscalationError as exc:
            raise click.UsageError(exc.message + "; nothing was sent") from None
        if (ask := answered(result, reply_to)) is not None:  # it wakes no one again
            show_ids(cfg, client, ident.id, [ask])
    result_exit(result, as_json)


COMMANDS = (escalate,)
