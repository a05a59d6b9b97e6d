"""MCP tools for the session's mail: send, ask, reply, the asks awaiting a reply, and the inbox,
each mapped onto the mailbox operation of NAME's held session."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents.answered import check_one_line, check_text, show_answered, show_by_id
from crossintercom.agents.escalations import supervisor as sup
from crossintercom.agents.escalations.escalation import answer_note
from crossintercom.agents.handover.mail import asks_left, fit_mail, fit_page, listed_left
from crossintercom.agents.mcp import results as res
from crossintercom.agents.mcp.results import guarded
from crossintercom.agents.session import AgentSession, show_lock
from crossintercom.client import MAX_ASK_TIMEOUT_S, load_attachment
from crossintercom.errors import UsageError
from crossintercom.inbox import Entry
from crossintercom.models import Priority

# Under Codex's default 60 s tool-call limit; `setup codex` raises that limit (docs/agents.md).
DEFAULT_ASK_S = 50.0

Target = Annotated[
    str, Field(description="NAME, NAME@HOST or a session id; send also takes group:NAME.")
]
Text = Annotated[str, Field(min_length=1)]
Timeout = Annotated[
    float, Field(description="Seconds to wait for the answer.", ge=1, le=MAX_ASK_TIMEOUT_S)
]

# Threads (docs/threads.md): optional on send and ask; a reply takes its ask's.
Subject = Annotated[str | None, Field(description="One line, for a new thread.", max_length=200)]
ThreadId = Annotated[
    str | None,
    Field(description="Thread to continue (its first message's id).", max_length=128),
]
# Marks (docs/delivery.md#priority, #acknowledgement).
PriorityArg = Annotated[Priority, Field()]
AckRequired = Annotated[bool, Field(description="The recipient is to acknowledge it.")]
AckWithin = Annotated[
    float | None,
    Field(description="Acknowledgement overdue after (s).", gt=0),
]


class MailTools:
    def __init__(self, session: AgentSession) -> None:
        self.session = session
        self.name = session.name
        self.log = sup.EscalationLog(session.settings, session.identity.id)

    @guarded
    async def pending(self) -> CallToolResult:
        """Asks awaiting your reply, oldest first."""
        async with self.session.operation() as client:
            asks = [m.to_dict() for m in await client.pending()]
        if not asks:
            return res.mail("No ask waits for your reply.")
        text, count = fit_mail(asks, self.name, left=asks_left(None))
        # The model was shown them: no hook or monitor hands them over again (docs/agents.md);
        # those the hand-over's budget left out were not shown.
        show_by_id(self.session, [str(m["id"]) for m in asks[:count]])
        return res.mail(text)

    @guarded
    async def send(
        self,
        to: Target,
        message: Text,
        attach_files: Annotated[list[str] | None, Field(description="UTF-8 text files.")] = None,
        subject: Subject = None,
        thread_id: ThreadId = None,
        priority: PriorityArg = "normal",
        ack_required: AckRequired = False,
        ack_within_s: AckWithin = None,
    ) -> CallToolResult:
        """Send a message; no answer awaited."""
        check_text(message)
        check_one_line("subject", subject)
        limit = self.session.settings.max_message_bytes
        files = [load_attachment(p, limit) for p in attach_files or ()]
        async with self.session.operation() as client:
            sent = await client.send(
                to,
                message,
                files,
                subject=subject,
                thread_id=thread_id,
                priority=priority,
                ack_required=ack_required,
                ack_within_s=ack_within_s,
            )
            return res.outcome(sent)

    @guarded
    async def ask(
        self,
        to: Target,
        message: Text,
        timeout_s: Timeout = DEFAULT_ASK_S,
        subject: Subject = None,
        thread_id: ThreadId = None,
        priority: PriorityArg = "normal",
    ) -> CallToolResult:
        """Ask and wait for the answer, only when you cannot go on without it; a late answer
        comes to your inbox."""
        check_text(message)
        check_one_line("subject", subject)
        async with self.session.operation() as client:
            result = await client.ask(
                to,
                message,
                timeout=timeout_s,
                subject=subject,
                thread_id=thread_id,
                priority=priority,
            )
        answer = res.ask_outcome(result, to, timeout_s, self.name)
        if result.reply is not None:  # the tool result shows the reply to the model
            self.session.report_shown([result.reply])
        return answer

    @guarded
    async def reply(
        self,
        message: Text,
        reply_to: Annotated[str | None, Field(description="The ask's id; default: oldest.")] = None,
        priority: PriorityArg = "normal",
    ) -> CallToolResult:
        """Answer an ask sent to you."""
        check_text(message)
        async with self.session.operation() as client:
            result = await client.reply(message, reply_to=reply_to, priority=priority)
        show_answered(self.session, result, reply_to)
        return res.outcome(result, "reply")

    @guarded
    async def inbox(
        self,
        unseen_only: bool = True,
        limit: Annotated[int, Field(ge=1, le=200)] = 20,
        message_id: Annotated[str | None, Field(description="Read one message on.")] = None,
        offset: Annotated[int, Field(description="Character to start at.", ge=0)] = 0,
        attachment: Annotated[str | None, Field(description="Read this attachment.")] = None,
    ) -> CallToolResult:
        """Your messages, oldest first, marked shown; the result says how to read what it left
        out."""
        if message_id is not None:
            return self._one(message_id, offset, attachment)
        settings, box, sid = self.session.settings, self.session.inbox, self.session.identity.id
        result: list[CallToolResult] = []

        def build(entries: list[Entry]) -> list[Entry]:
            # Every unseen message counts in what the result says is left (docs/agents.md).
            text, count = self._mail_text(entries[:limit], len(entries))
            result.append(res.mail(text))
            return entries[:count]

        if unseen_only:
            await self.session.sync()
            self.session.show(build)
            return result[0] if result else res.mail("No unseen messages.")
        with show_lock(settings, sid):
            entries = [e for e in box.transcript() if e.kind == "message"][-limit:]
            text, count = self._mail_text(entries, len(entries), listed_left())
            fresh = [e for e in entries[:count] if not e.shown]
            box.mark_shown([e.seq for e in fresh])
        self.session.report_shown(fresh)
        return res.mail(text)

    def _one(self, message_id: str, offset: int, attachment: str | None) -> CallToolResult:
        entry = self.session.inbox.message(message_id)
        if entry is None:
            raise UsageError("no message with that id in your inbox; nothing was read")
        text = fit_page(entry.body, self.name, offset, attachment, self._note(entry.body))
        if text is None:
            raise UsageError("that message has no attachment so named; nothing was read")
        show_by_id(self.session, [message_id])
        return res.mail(text)

    def _note(self, body: Mapping[str, Any]) -> str | None:
        answer = self.log.answer_in(body)
        if answer is None:
            return None
        return "It answers your escalation: " + answer_note(answer.to_dict())

    def _mail_text(
        self, entries: list[Entry], total: int, left: Callable[[int], str] | None = None
    ) -> tuple[str, int]:
        """The framed messages that fit one result, and how many; ``total`` are waiting."""
        bodies = [e.body for e in entries]
        if not bodies:
            return "No messages.", 0
        notes = {str(b["id"]): n for b in bodies if (n := self._note(b)) is not None}
        return fit_mail(bodies, self.name, notes, total=total, left=left)

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        return {
            "pending": (self.pending, True),
            "send": (self.send, False),
            "ask": (self.ask, False),
            "reply": (self.reply, False),
            "inbox": (self.inbox, False),
        }
