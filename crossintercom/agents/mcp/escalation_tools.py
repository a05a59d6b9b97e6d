"""MCP tools for escalations to a supervisor and their answers (docs/agents.md#escalations).
An escalation waits as an ask does (``mail_tools``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents.answered import show_answered
from crossintercom.agents.escalations import supervisor as sup
from crossintercom.agents.escalations.escalation import Escalation, EscalationError, answer_note
from crossintercom.agents.mcp import results as res
from crossintercom.agents.mcp.mail_tools import DEFAULT_ASK_S, Timeout
from crossintercom.agents.mcp.results import guarded
from crossintercom.agents.session import AgentSession

OptionalTarget = Annotated[str | None, Field(description="Default: your supervisor.")]


class EscalationTools:
    def __init__(self, session: AgentSession, supervisor: str | None) -> None:
        self.session = session
        self.supervisor = supervisor
        self.name = session.name

    def _to(self, to: str | None) -> str:
        target = to or self.supervisor
        if not target:
            raise EscalationError(
                ["no recipient: give `to`, or start the server with --supervisor TARGET"]
            )
        return target

    async def _escalate(self, to: str | None, esc: Escalation, timeout: float) -> CallToolResult:
        target = self._to(to)
        async with self.session.operation() as client:
            result = await sup.escalate(client, target, esc, timeout=timeout)
        if not esc.blocking:
            return res.outcome(result.sent, "progress update")
        answer = result.answer.to_dict() if result.answer else None
        note = "The answer, as checked: " + answer_note(answer) if answer is not None else None
        if result.sent.reply is not None:
            self.session.report_shown([result.sent.reply])
        return res.ask_outcome(result.sent, target, timeout, self.name, note)

    @guarded
    async def escalate_decision(
        self,
        question: Annotated[str, Field(min_length=1)],
        options: list[str] | None = None,
        context: str | None = None,
        to: OptionalTarget = None,
        timeout_s: Timeout = DEFAULT_ASK_S,
    ) -> CallToolResult:
        """Ask your supervisor for a decision and wait for it."""
        return await self._escalate(
            to, Escalation.decision(question, options or (), context), timeout_s
        )

    @guarded
    async def escalate_interview(
        self,
        questions: Annotated[
            list[dict[str, Any]],
            Field(
                description='{"id", "type": single|multi|text|info, "question", "options"?, '
                '"context"?}; single/multi need options.'
            ),
        ],
        title: str | None = None,
        to: OptionalTarget = None,
        timeout_s: Timeout = DEFAULT_ASK_S,
    ) -> CallToolResult:
        """Ask your supervisor several structured questions and wait."""
        return await self._escalate(to, Escalation.interview(questions, title), timeout_s)

    @guarded
    async def escalate_progress(
        self,
        summary: Annotated[str, Field(min_length=1)],
        percent: Annotated[float | None, Field(ge=0, le=100)] = None,
        details: str | None = None,
        to: OptionalTarget = None,
    ) -> CallToolResult:
        """Tell your supervisor how the work goes; no answer awaited."""
        return await self._escalate(to, Escalation.progress(summary, percent, details), 1.0)

    @guarded
    async def answer_escalation(
        self,
        reply_to: Annotated[str, Field(description="The escalation's message id.")],
        responses: Annotated[
            list[dict[str, Any]],
            Field(
                description='{"id", "value"} per question: an option (single), a list of '
                "options (multi), a string (text); none for info."
            ),
        ],
    ) -> CallToolResult:
        """Answer an escalation sent to you."""
        async with self.session.operation() as client:
            result = await sup.answer(client, reply_to, responses)
        show_answered(self.session, result, reply_to)  # answered: it wakes no one again
        return res.outcome(result, "answer")

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        return {
            "escalate_decision": (self.escalate_decision, False),
            "escalate_interview": (self.escalate_interview, False),
            "escalate_progress": (self.escalate_progress, False),
            "answer_escalation": (self.answer_escalation, False),
        }
