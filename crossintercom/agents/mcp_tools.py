"""The MCP server's tools, mapped onto the mailbox operations of NAME's held session."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, ParamSpec

from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents import mcp_results as res
from crossintercom.agents import supervisor as sup
from crossintercom.agents.answered import check_one_line, check_text, show_answered, show_by_id
from crossintercom.agents.escalation import EscalationError, answer_note
from crossintercom.agents.framing import one_line
from crossintercom.agents.mail import asks_left, fit_mail, fit_page, listed_left
from crossintercom.agents.session import AgentSession, show_lock, unseen
from crossintercom.client import MAX_ASK_TIMEOUT_S, load_attachment
from crossintercom.errors import (
    BrokerUnavailable,
    Code,
    CrossintercomError,
    Disconnected,
    RemoteError,
    UsageError,
)
from crossintercom.inbox import Entry
from crossintercom.models import DESCRIPTION_CHARS, NAME_RULE, Priority, valid_name
from crossintercom.storage.urls import mask_url

P = ParamSpec("P")
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
        except (BrokerUnavailable, Disconnected):
            return res.error(Code.BROKER_UNAVAILABLE, res.BROKER_DOWN + "; nothing was done")
        except RemoteError as exc:
            if exc.code in (Code.BAD_FIELD, Code.MISSING_FIELD):
                # The broker's decoder names its own frame's fields: say it plainly instead.
                return res.error(
                    exc.code, "the broker refused a value as malformed; nothing was done"
                )
            return res.error(exc.code, exc.message)
        except CrossintercomError as exc:
            return res.error(exc.code, exc.message)

    return run


def _check_group(group: str) -> None:
    if not valid_name(group):
        raise UsageError(f"invalid group name: {NAME_RULE}; nothing was done")


class Tools:
    def __init__(self, session: AgentSession, supervisor: str | None) -> None:
        self.session = session
        self.supervisor = supervisor
        self.name = session.name
        self.log = sup.EscalationLog(session.settings, session.identity.id)

    # --- read-only ----------------------------------------------------------------------------

    @guarded
    async def whoami(self) -> CallToolResult:
        """Who and where you are, and what mail waits."""
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
            f"You are {self.name}@{one_line(data['host'])} (session {data['session_id']}). "
            f"Supervisor: {one_line(self.supervisor or 'none')}. Unseen messages: "
            f"{data['unseen']}; asks waiting for your reply: {waiting}. Other hosts "
            f"{'are' if data['relay_connected'] else 'are NOT'} reachable (relay)."
        )
        return res.ok(text, data)

    @guarded
    async def list_sessions(
        self,
        online_only: bool = True,
        host: str | None = None,
        group: str | None = None,
    ) -> CallToolResult:
        """Sessions on every host you can message."""
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
    async def groups(self) -> CallToolResult:
        """Groups on every host and their members."""
        async with self.session.operation() as client:
            found = await client.groups()
        lines = [
            f"- {one_line(g.name)}: "
            + ", ".join(f"{one_line(m.name)}@{one_line(m.host)}" for m in g.members)
            for g in found
        ]
        return res.text_only("\n".join(lines) or "No groups.")

    # --- mail ---------------------------------------------------------------------------------

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

    # --- membership and status ----------------------------------------------------------------

    @guarded
    async def join(self, group: str) -> CallToolResult:
        """Join a group."""
        _check_group(group)
        async with self.session.operation() as client:
            now = await client.join(group)
        return res.ok(f"You are in: {', '.join(map(one_line, now))}.", {"groups": now})

    @guarded
    async def leave(self, group: str) -> CallToolResult:
        """Leave a group."""
        _check_group(group)
        async with self.session.operation() as client:
            now = await client.leave(group)
        joined = ", ".join(map(one_line, now)) or "(no groups)"
        return res.ok(f"You are in: {joined}.", {"groups": now})

    @guarded
    async def set_status(
        self,
        status: Annotated[
            str | None,
            Field(description="null clears it.", max_length=DESCRIPTION_CHARS),
        ],
    ) -> CallToolResult:
        """Set the one-line status others see in list_sessions."""
        if status is not None:
            check_text(status, "status")
            check_one_line("status", status)
        async with self.session.operation() as client:
            await client.set_status(status)
        return res.ok(f"Status {'cleared' if status is None else 'set'}.", {"status": status})

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
        }
