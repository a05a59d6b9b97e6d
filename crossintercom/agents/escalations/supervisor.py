"""The escalation API: ask a supervisor for a decision or an interview, report progress, answer.

Async functions take an ``AsyncClient``; the ``*_sync`` twins take a ``Client``::

    from crossintercom.agents.escalations import supervisor
    with Client(cfg, Identity.named(cfg, "worker")) as me:
        result = supervisor.need_decision_sync(me, "lead", "Ship it?", options=["yes", "no"])
        if result.answer and result.answer.valid:
            print(result.answer.responses["decision"])

A blocking escalation waits at most ``timeout`` seconds; when no answer came by then, the answer
still arrives later in the asker's inbox (flagged ``late``), and ``EscalationLog`` lets any
surface read it against the questions it answers (docs/agents.md#escalations).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossintercom.agents.escalations.escalation import (
    Answer,
    Escalation,
    answer_text,
    escalation_of,
    parse_answer,
)
from crossintercom.agents.session import agents_dir
from crossintercom.client import MAX_ASK_TIMEOUT_S, AsyncClient, Client
from crossintercom.config import Settings
from crossintercom.errors import RuntimeDirError, UsageError
from crossintercom.models import Outcome, SendResult, new_id
from crossintercom.runtime import ensure_subdir, group_gid, modes, open_file, replace_file

# Sent escalations are kept as long as queued mail is (its answer may come that late).
LOG_KEEP_S = 8 * 86400.0
# An escalation record is a few KiB; more is not one of ours.
_RECORD_MAX = 1024 * 1024


@dataclass(frozen=True, slots=True)
class EscalationResult:
    """The send outcome and, for a blocking escalation answered in time, the answer."""

    escalation: Escalation
    sent: SendResult
    answer: Answer | None = None

    @property
    def answered(self) -> bool:
        return self.answer is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.escalation.kind,
            **self.sent.to_dict(),
            "answer": self.answer.to_dict() if self.answer is not None else None,
        }


class EscalationLog:
    """The blocking escalations a session sent, by message id, so a late answer can be read."""

    def __init__(self, settings: Settings, session_id: str) -> None:
        self.settings = settings
        self.dir = agents_dir(settings) / f"{session_id}.escalations"

    def _path(self, message_id: str) -> Path:
        return self.dir / f"{Path(message_id).name}.json"

    def remember(self, message_id: str, esc: Escalation) -> None:
        # The dir is this user's alone and each record a new file renamed into place, so a
        # member of a group runtime dir can redirect no write (docs/operations.md).
        ensure_subdir(self.settings, self.dir, own=True)
        data = json.dumps(esc.to_payload()).encode()
        replace_file(
            self._path(message_id), data, modes(self.settings)[1], gid=group_gid(self.settings)
        )
        self._prune()

    def lookup(self, message_id: str) -> Escalation | None:
        try:
            fd = open_file(self._path(message_id), os.O_RDONLY, gid=group_gid(self.settings))
        except (OSError, RuntimeDirError):
            return None  # none, or not a record of ours: a planted link is never read
        try:
            with os.fdopen(fd, "rb") as f:
                return Escalation.from_payload(json.loads(f.read(_RECORD_MAX)))
        except (OSError, ValueError):
            return None

    def answer_in(self, message: Mapping[str, Any]) -> Answer | None:
        """The answer a received reply carries, when it answers one of our escalations."""
        reply_to = message.get("reply_to")
        esc = self.lookup(reply_to) if isinstance(reply_to, str) else None
        return parse_answer(esc, str(message.get("message", ""))) if esc else None

    def _prune(self) -> None:
        cutoff = time.time() - LOG_KEEP_S
        for old in self.dir.glob("*.json"):
            if old.lstat().st_mtime < cutoff:
                old.unlink(missing_ok=True)


def _log(client: AsyncClient) -> EscalationLog | None:
    return EscalationLog(client.settings, client.identity.id) if client.identity else None


async def escalate(
    client: AsyncClient, to: str, esc: Escalation, *, timeout: float = MAX_ASK_TIMEOUT_S
) -> EscalationResult:
    """Send an escalation; for a blocking one, wait up to ``timeout`` for the answer."""
    attachments = [esc.attachment()]
    text = esc.render_text()
    if not esc.blocking:
        return EscalationResult(esc, await client.send(to, text, attachments))
    message_id = new_id()
    log = _log(client)
    if log is not None:
        log.remember(message_id, esc)  # before sending: an answer can be faster than we are
    sent = await client.ask(to, text, attachments, timeout=timeout, message_id=message_id)
    answer = parse_answer(esc, sent.reply.text) if sent.reply is not None else None
    return EscalationResult(esc, sent, answer)


async def need_decision(
    client: AsyncClient,
    to: str,
    question: str,
    options: Sequence[str] = (),
    context: str | None = None,
    *,
    timeout: float = MAX_ASK_TIMEOUT_S,
) -> EscalationResult:
    return await escalate(
        client, to, Escalation.decision(question, options, context), timeout=timeout
    )


async def interview(
    client: AsyncClient,
    to: str,
    questions: Any,
    title: str | None = None,
    *,
    timeout: float = MAX_ASK_TIMEOUT_S,
) -> EscalationResult:
    return await escalate(client, to, Escalation.interview(questions, title), timeout=timeout)


async def progress(
    client: AsyncClient,
    to: str,
    summary: str,
    percent: float | None = None,
    details: str | None = None,
) -> EscalationResult:
    return await escalate(client, to, Escalation.progress(summary, percent, details))


async def pending_escalation(client: AsyncClient, reply_to: str) -> Escalation:
    """The escalation behind the ask ``reply_to`` that waits for this session's answer."""
    for m in await client.pending():
        if m.id == reply_to:
            esc = escalation_of(m.to_dict())
            if esc is None or not esc.blocking:
                raise UsageError(f"ask {reply_to} is not an escalation; answer it with reply")
            return esc
    raise UsageError(f"no ask {reply_to} waits for your answer (see pending)")


async def answer(
    client: AsyncClient,
    reply_to: str,
    responses: Mapping[str, Any] | Sequence[Mapping[str, Any]],
) -> SendResult:
    """Answer an escalation delivered to this session. The answer is checked against its
    questions first: an invalid one raises ``EscalationError`` listing every problem, and
    nothing is sent."""
    esc = await pending_escalation(client, reply_to)
    return await client.reply(answer_text(esc, responses), reply_to=reply_to)


def need_decision_sync(client: Client, to: str, question: str, **kw: Any) -> EscalationResult:
    return client.run(lambda c: need_decision(c, to, question, **kw))


def interview_sync(client: Client, to: str, questions: Any, **kw: Any) -> EscalationResult:
    return client.run(lambda c: interview(c, to, questions, **kw))


def progress_sync(client: Client, to: str, summary: str, **kw: Any) -> EscalationResult:
    return client.run(lambda c: progress(c, to, summary, **kw))


def answer_sync(client: Client, reply_to: str, responses: Any) -> SendResult:
    return client.run(lambda c: answer(c, reply_to, responses))


def waiting_ok(result: SendResult) -> bool:
    """True when the escalation reached the supervisor's mailbox (an answer may still come)."""
    return result.outcome in (Outcome.DELIVERED, Outcome.QUEUED)
