"""The MCP server's tools, mapped onto the mailbox operations of NAME's held session."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, ParamSpec

import msgspec
from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents import mcp_results as res
from crossintercom.agents import supervisor as sup
from crossintercom.agents.escalation import Escalation, EscalationError
from crossintercom.agents.framing import neutralise
from crossintercom.agents.mail import render_mail
from crossintercom.agents.session import AgentSession, show_lock, unseen
from crossintercom.client import MAX_ASK_TIMEOUT_S, load_attachment
from crossintercom.errors import BrokerUnavailable, Code, CrossintercomError, Disconnected
from crossintercom.inbox import Entry
from crossintercom.storage.urls import mask_url

P = ParamSpec("P")
# Under Codex's default 60 s tool-call limit; `setup codex` raises that limit (docs/agents.md).
DEFAULT_ASK_S = 50.0

Target = Annotated[
    str, Field(description="Session id, NAME, NAME@HOSTID (or group:NAME for send).")
]
Text = Annotated[str, Field(description="The message text.", min_length=1)]
Timeout = Annotated[
    float, Field(description="Seconds to wait for the answer (1-600).", ge=1, le=MAX_ASK_TIMEOUT_S)
]
OptionalTarget = Annotated[
    str | None, Field(description="Recipient; default: this session's supervisor.")
]

# Threads (docs/threads.md): optional on send and ask; a reply takes its ask's.
Subject = Annotated[
    str | None, Field(description="A one-line subject for a new conversation.", max_length=200)
]
ThreadId = Annotated[
    str | None, Field(description="Continue this thread (its first message's id).")
]


def guarded(
    fn: Callable[P, Awaitable[CallToolResult]],
) -> Callable[P, Awaitable[CallToolResult]]:
    """Turn a crossintercom error into an error result with its stable code."""

    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> CallToolResult:
        try:
            return await fn(*args, **kwargs)
        except EscalationError as exc:
            return res.error(exc.code, exc.message + "; nothing was sent")
        except (BrokerUnavailable, Disconnected) as exc:
            return res.error(Code.BROKER_UNAVAILABLE, exc.message + "; nothing was done")
        except CrossintercomError as exc:
            return res.error(exc.code, exc.message)

    return run


def _answer_note(a: Mapping[str, Any]) -> str:
    if a["valid"]:
        return "valid; responses " + json.dumps(a["responses"], ensure_ascii=False)
    return "it does NOT fit the questions: " + "; ".join(a["problems"])


class Tools:
    def __init__(self, session: AgentSession, supervisor: str | None) -> None:
        self.session = session
        self.supervisor = supervisor
        self.name = session.name
        self.log = sup.EscalationLog(session.settings, session.identity.id)

    def _to(self, to: str | None) -> str:
        target = to or self.supervisor
        if not target:
            raise EscalationError(
                ["no recipient: give `to`, or start the server with --supervisor TARGET"]
            )
        return target

    # --- read-only ----------------------------------------------------------------------------

    @guarded
    async def whoami(self) -> CallToolResult:
        """Who this session is, where it runs, and how much mail waits."""
        async with self.session.operation() as client:
            st = await client.status()
            waiting = len(await client.pending())
        info = client.session
        data = {
            "name": self.name,
            "host": self.session.settings.host_id,
            "session_id": self.session.identity.id,
            "supervisor": self.supervisor,
            "holds_session": self.session.owner,
            "status": info.status if info else None,
            "wake": await self.session.wake_policy(),
            "unseen": len(unseen(self.session.inbox)),
            "pending_asks": waiting,
            "relay_connected": st.relay.connected,
            "store": mask_url(self.session.settings.store_url)
            if self.session.settings.store_url
            else None,
        }
        text = (
            f"You are {self.name}@{neutralise(str(data['host']))} (session {data['session_id']}). "
            f"Supervisor: {neutralise(self.supervisor or 'none')}. Unseen messages: "
            f"{data['unseen']}; asks waiting for your reply: {waiting}. Other hosts "
            f"{'are' if data['relay_connected'] else 'are NOT'} reachable (relay)."
        )
        return res.ok(text, data)

    @guarded
    async def list_sessions(
        self,
        online_only: Annotated[bool, Field(description="Only sessions online now.")] = True,
        host: Annotated[str | None, Field(description="Only sessions on this host id.")] = None,
        group: Annotated[str | None, Field(description="Only members of this group.")] = None,
    ) -> CallToolResult:
        """Sessions on every host that you can message."""
        async with self.session.operation() as client:
            found = await client.list_sessions()
        found = [
            s
            for s in found
            if (s.online or not online_only)
            and (host is None or s.host == host)
            and (group is None or group in s.groups)
        ]
        note = "Online sessions:" if online_only else "Sessions (online and known offline):"
        return res.sessions(found, note)

    @guarded
    async def pending(self) -> CallToolResult:
        """Asks that wait for your reply, oldest first."""
        async with self.session.operation() as client:
            asks = [m.to_dict() for m in await client.pending()]
        return res.messages(asks, self.name, "No ask waits for your reply.", {})

    @guarded
    async def groups(self) -> CallToolResult:
        """Groups on every host and their members."""
        async with self.session.operation() as client:
            found = await client.groups()
        lines = [
            f"- {neutralise(g.name)}: "
            + ", ".join(f"{neutralise(m.name)}@{neutralise(m.host)}" for m in g.members)
            for g in found
        ]
        return res.ok("\n".join(lines) or "No groups.", {"groups": msgspec.to_builtins(found)})

    # --- mail ---------------------------------------------------------------------------------

    @guarded
    async def send(
        self,
        to: Target,
        message: Text,
        attach_files: Annotated[
            list[str] | None, Field(description="Paths of UTF-8 text files to attach.")
        ] = None,
        subject: Subject = None,
        thread_id: ThreadId = None,
    ) -> CallToolResult:
        """Send a message and go on (no answer awaited). Use it for information and requests."""
        limit = self.session.settings.max_message_bytes
        files = [load_attachment(p, limit) for p in attach_files or ()]
        async with self.session.operation() as client:
            sent = await client.send(to, message, files, subject=subject, thread_id=thread_id)
            return res.outcome(sent)

    @guarded
    async def ask(
        self,
        to: Target,
        message: Text,
        timeout_s: Timeout = DEFAULT_ASK_S,
        subject: Subject = None,
        thread_id: ThreadId = None,
    ) -> CallToolResult:
        """Ask and wait for the answer (at most timeout_s). Use it only when you cannot go on
        without the answer; a late answer arrives in your inbox."""
        async with self.session.operation() as client:
            result = await client.ask(
                to, message, timeout=timeout_s, subject=subject, thread_id=thread_id
            )
        answer = res.ask_outcome(result, to, timeout_s, self.name)
        if result.reply is not None:  # the tool result shows the reply to the model
            self.session.report_shown([result.reply])
        return answer

    @guarded
    async def reply(
        self,
        message: Text,
        reply_to: Annotated[
            str | None, Field(description="The ask's id; default: the oldest pending ask.")
        ] = None,
    ) -> CallToolResult:
        """Answer an ask that was delivered to you."""
        async with self.session.operation() as client:
            return res.outcome(await client.reply(message, reply_to=reply_to), "reply")

    @guarded
    async def inbox(
        self,
        unseen_only: Annotated[
            bool, Field(description="Only messages never shown (default).")
        ] = True,
        limit: Annotated[int, Field(description="At most this many messages.", ge=1, le=200)] = 20,
    ) -> CallToolResult:
        """Your messages, oldest first; what it returns is marked shown."""
        settings, box, sid = self.session.settings, self.session.inbox, self.session.identity.id
        result: list[CallToolResult] = []

        def build(entries: list[Entry]) -> None:
            result.append(self._mail_result(entries))

        if unseen_only:
            await self.session.sync()
            self.session.show(build, limit=limit)
            return result[0] if result else res.messages([], self.name, "No unseen messages.", {})
        with show_lock(settings, sid):
            entries = [e for e in box.transcript() if e.kind == "message"][-limit:]
            build(entries)
            fresh = [e for e in entries if not e.shown]
            box.mark_shown([e.seq for e in fresh])
        self.session.report_shown(fresh)
        return result[0]

    def _mail_result(self, entries: list[Entry]) -> CallToolResult:
        bodies = [e.body for e in entries]
        answers: dict[str, Any] = {}
        for body in bodies:
            answer = self.log.answer_in(body)
            if answer is not None:
                answers[body["id"]] = answer.to_dict()
        text = render_mail(bodies, self.name) if bodies else "No messages."
        for mid, a in answers.items():
            text += f"\n\nMessage {mid} answers your escalation: " + _answer_note(a)
        return res.ok(text, {"messages": bodies, "escalation_answers": answers})

    # --- membership and status ----------------------------------------------------------------

    @guarded
    async def join(self, group: Annotated[str, Field(description="Group name.")]) -> CallToolResult:
        """Join a group (kept for this durable session)."""
        async with self.session.operation() as client:
            now = await client.join(group)
        return res.ok(f"You are in: {', '.join(now)}.", {"groups": now})

    @guarded
    async def leave(
        self, group: Annotated[str, Field(description="Group name.")]
    ) -> CallToolResult:
        """Leave a group."""
        async with self.session.operation() as client:
            now = await client.leave(group)
        return res.ok(f"You are in: {', '.join(now) or '(no groups)'}.", {"groups": now})

    @guarded
    async def set_status(
        self,
        status: Annotated[
            str | None, Field(description="Short status others see in list; null clears it.")
        ],
    ) -> CallToolResult:
        """Set the status text others see for you."""
        async with self.session.operation() as client:
            await client.set_status(status)
        return res.ok(f"Status {'cleared' if status is None else 'set'}.", {"status": status})

    # --- escalations --------------------------------------------------------------------------

    async def _escalate(self, to: str | None, esc: Escalation, timeout: float) -> CallToolResult:
        target = self._to(to)
        async with self.session.operation() as client:
            result = await sup.escalate(client, target, esc, timeout=timeout)
        if not esc.blocking:
            return res.outcome(result.sent, "progress update")
        answer = result.answer.to_dict() if result.answer else None
        text = res.ask_text(result.sent, target, timeout, self.name)
        if answer is not None:
            text += "\nThe answer: " + _answer_note(answer)
        data = result.sent.to_dict() | {
            "kind": esc.kind,
            "reply": result.sent.reply.to_dict() if result.sent.reply else None,
            "answer": answer,
        }
        return res.ok(text, data)

    @guarded
    async def escalate_decision(
        self,
        question: Annotated[str, Field(description="The decision you need.", min_length=1)],
        options: Annotated[list[str] | None, Field(description="Choices, if any.")] = None,
        context: Annotated[
            str | None, Field(description="What the supervisor should know.")
        ] = None,
        to: OptionalTarget = None,
        timeout_s: Timeout = DEFAULT_ASK_S,
    ) -> CallToolResult:
        """Ask your supervisor for a decision and wait for it (need_decision)."""
        return await self._escalate(
            to, Escalation.decision(question, options or (), context), timeout_s
        )

    @guarded
    async def escalate_interview(
        self,
        questions: Annotated[
            list[dict[str, Any]],
            Field(
                description='Questions {"id", "type": single|multi|text|info, "question", '
                '"options"?, "context"?}; single/multi need options.'
            ),
        ],
        title: Annotated[str | None, Field(description="What the interview is about.")] = None,
        to: OptionalTarget = None,
        timeout_s: Timeout = DEFAULT_ASK_S,
    ) -> CallToolResult:
        """Ask your supervisor several structured questions and wait (interview_request)."""
        return await self._escalate(to, Escalation.interview(questions, title), timeout_s)

    @guarded
    async def escalate_progress(
        self,
        summary: Annotated[str, Field(description="Where the work stands.", min_length=1)],
        percent: Annotated[float | None, Field(description="Done, 0-100.", ge=0, le=100)] = None,
        details: Annotated[str | None, Field(description="More detail.")] = None,
        to: OptionalTarget = None,
    ) -> CallToolResult:
        """Tell your supervisor how the work goes; no answer is awaited (progress_update)."""
        return await self._escalate(to, Escalation.progress(summary, percent, details), 1.0)

    @guarded
    async def answer_escalation(
        self,
        reply_to: Annotated[str, Field(description="The escalation's message id.")],
        responses: Annotated[
            list[dict[str, Any]],
            Field(
                description='One {"id", "value"} per question: single: an option; multi: a '
                "list of options; text: a string; info: no answer needed."
            ),
        ],
    ) -> CallToolResult:
        """Answer a decision or interview escalation sent to you; it is checked first."""
        async with self.session.operation() as client:
            return res.outcome(await sup.answer(client, reply_to, responses), "answer")

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        return {
            "whoami": (self.whoami, True),
            "list_sessions": (self.list_sessions, True),
            "pending": (self.pending, True),
            "groups": (self.groups, True),
            "send": (self.send, False),
            "ask": (self.ask, False),
            "reply": (self.reply, False),
            "inbox": (self.inbox, False),
            "join": (self.join, False),
            "leave": (self.leave, False),
            "set_status": (self.set_status, False),
            "escalate_decision": (self.escalate_decision, False),
            "escalate_interview": (self.escalate_interview, False),
            "escalate_progress": (self.escalate_progress, False),
            "answer_escalation": (self.answer_escalation, False),
        }
