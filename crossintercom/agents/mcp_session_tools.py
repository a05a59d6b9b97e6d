"""MCP tools about the session itself: its wake policy and the receipts for what it sent
(docs/agents.md#the-mcp-server). Beside ``mcp_tools``, which maps the mailbox operations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal

from mcp.types import CallToolResult
from pydantic import Field

from crossintercom.agents import mcp_results as res
from crossintercom.agents.answered import check_one_line
from crossintercom.agents.framing import header_field, one_line, quoted
from crossintercom.agents.mcp_tools import guarded
from crossintercom.agents.session import AgentSession
from crossintercom.client import (
    acknowledge,
    awaiting_mine,
    dead_letter_json,
    dead_letters,
    inbound_json,
    inbound_policy,
    resend,
    sent_awaiting,
    set_wake,
)
from crossintercom.errors import UsageError
from crossintercom.models import ACK_NOTE_CHARS, Outcome, WakePolicy

_WAKE_TEXT = {
    "every": "every new message wakes you",
    "asks": "only asks (messages waiting for your answer) wake you; other mail waits in your inbox",
    "urgent": "only urgent mail wakes you; other mail waits in your inbox",
    "never": "nothing wakes you; read your inbox yourself",
}


class SessionTools:
    def __init__(self, session: AgentSession) -> None:
        self.session = session

    @guarded
    async def set_wake(
        self,
        policy: WakePolicy,
    ) -> CallToolResult:
        """Which new mail wakes you when idle: every, asks, urgent or never."""
        async with self.session.operation() as client:
            info = await set_wake(client, policy)
        self.session.note_wake(info.wake)
        return res.ok(f"Wake policy {info.wake}: {_WAKE_TEXT[info.wake]}.", {"wake": info.wake})

    @guarded
    async def receipts(
        self,
        message_id: str | None = None,
        limit: Annotated[int, Field(ge=1, le=500)] = 50,
    ) -> CallToolResult:
        """What became of messages you sent (delivered, shown, expired ...), newest last."""
        found = [
            e.body
            for e in self.session.inbox.receipts()
            if message_id is None or e.body.get("id") == message_id
        ][-limit:]
        lines = [_receipt_line(r) for r in found]
        return res.text_only("\n".join(lines) or "No receipts.")

    @guarded
    async def ack(
        self,
        message_ids: Annotated[list[str], Field(min_length=1)],
        note: Annotated[
            str | None, Field(description="One line for the sender.", max_length=ACK_NOTE_CHARS)
        ] = None,
    ) -> CallToolResult:
        """Acknowledge messages whose senders asked for it (a reply needs none)."""
        check_one_line("note", note)
        done = acknowledge(self.session.client, message_ids, note)
        return res.ok(f"Acknowledged {', '.join(done)}.", {"acknowledged": done})

    @guarded
    async def acks(
        self,
        sent: Annotated[bool, Field(description="true: what you sent.")] = False,
    ) -> CallToolResult:
        """Messages awaiting your acknowledgement (or sent: others'), ages, overdue ones."""
        if sent:
            async with self.session.operation() as client:
                rows = await sent_awaiting(client)
        else:
            rows = awaiting_mine(self.session.inbox)
        lines = [
            f"- {one_line(r['id'])} {_ack_line(r, sent)}, {r['age_s']:.0f}s ago"
            + (" OVERDUE" if r["overdue"] else "")
            for r in rows
        ]
        return res.text_only("\n".join(lines) or "Nothing awaits acknowledgement.")

    @guarded
    async def dead_letters(self) -> CallToolResult:
        """Messages you sent that never arrived, and why."""
        async with self.session.operation() as client:
            rows = [dead_letter_json(d) for d in await dead_letters(client)]
        lines = [
            f"- {one_line(r['id'])} to {one_line(r['to'])}: {one_line(r['outcome'])} "
            f"({one_line(r['code'] or r['outcome'])})"
            + (f", resent as {one_line(r['resent_as'])}" if r["resent_as"] else "")
            for r in rows
        ]
        return res.ok("\n".join(lines) or "No dead letters.", {"dead_letters": rows})

    @guarded
    async def resend(
        self,
        message_id: Annotated[str, Field(description="A dead letter's id.")],
        recipient: Annotated[str | None, Field(description="Only this session id.")] = None,
    ) -> CallToolResult:
        """Send a dead letter again, as a new message in its thread."""
        async with self.session.operation() as client:
            result = await resend(client, message_id, recipient)
        return res.outcome(result)

    @guarded
    async def inbound_policy(
        self,
        pattern: Annotated[
            str | None,
            Field(description="NAME, NAME@HOST, *@HOST, group:NAME (hold, refuse only) or *."),
        ] = None,
        action: Literal["accept", "hold", "refuse"] | None = None,
        remove: bool = False,
        release: Annotated[list[str] | None, Field(description="Held ids; ['*']: all.")] = None,
    ) -> CallToolResult:
        """Accept, hold or refuse a sender's mail; release held mail. No arguments: list."""
        if pattern is not None and action is None and not remove:
            raise UsageError("give an action for the pattern, or remove=true")
        async with self.session.operation() as client:
            state = await inbound_policy(client, pattern, None if remove else action, release)
        out = inbound_json(state)
        lines = [f"- {one_line(k)}: {v}" for k, v in out["rules"].items()] or ["No rules."]
        # Held mail is another session's words: never shown here, outside its frame; released,
        # it is read framed (docs/agents.md). Its sender is text only, as in list_sessions.
        lines += [
            f"held {header_field(h['id'])} from {header_field(h['from'])}, "
            f"{len(h['message'])} characters (release it to read it)"
            for h in out["held"]
        ]
        if out["released"]:
            lines.append(f"Released {out['released']}: read it with inbox.")
        return res.text_only("\n".join(lines))

    def all(self) -> Mapping[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]]:
        """Tool name -> (function, read-only)."""
        tools: dict[str, tuple[Callable[..., Awaitable[CallToolResult]], bool]] = {
            "set_wake": (self.set_wake, False),
            "receipts": (self.receipts, True),
            "ack": (self.ack, False),
            "acks": (self.acks, True),
            "dead_letters": (self.dead_letters, True),
            "resend": (self.resend, False),
            "inbound_policy": (self.inbound_policy, False),
        }
        return tools


def _receipt_line(r: Mapping[str, Any]) -> str:
    f = header_field
    line = f"- {f(r.get('id'))} to {f(r.get('recipient') or '?')}"
    line += (f"@{f(r['host'])}" if r.get("host") else "") + f": {f(r.get('outcome'))}"
    line += f" ({f(r['code'])})" if r.get("code") else ""
    if r.get("message") and r.get("outcome") == Outcome.ACKNOWLEDGED:
        # An acknowledgement's note is the recipient's free text, quoted as such.
        return line + f"; its note, in its own words: {quoted(r['message'])}"
    return line + (f": {one_line(r['message'])}" if r.get("message") else "")


def _ack_line(r: Mapping[str, Any], sent: bool) -> str:
    f = header_field
    if not sent:
        sender = r.get("from") or {}
        return f"from {f(sender.get('name') or sender.get('id'))}@{f(sender.get('host'))}"
    if r["acknowledged"]:
        note = f"; its note, in its own words: {quoted(r['note'])}" if r.get("note") else ""
        return f"to {f(r['to'])}: acknowledged by {f(r['acknowledged_by'])}{note}"
    return f"to {f(r['to'])}: awaiting"
