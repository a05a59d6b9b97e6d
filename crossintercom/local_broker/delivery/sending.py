"""Send, ask and reply: resolve, lodge, deliver or forward, settle (docs/delivery.md).

An operation lodges its id in the dedup authority before anything leaves, delivers to local
targets and forwards the rest through the relay, then settles the record with the outcome.
Each step's rule is in ``outcomes``; this module only sequences them.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Coroutine
from typing import Any, Final

import msgspec

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import Code
from crossintercom.local_broker.authority.dedup import (
    AuthorityUnavailable,
    Decision,
    DedupAuthority,
)
from crossintercom.local_broker.authority.groupcommit import GroupCommit
from crossintercom.local_broker.delivery import outcomes
from crossintercom.local_broker.delivery.local import Delivery
from crossintercom.local_broker.delivery.outcomes import Refusal
from crossintercom.local_broker.delivery.ratelimit import RateLimiter
from crossintercom.local_broker.delivery.relay_link import RelayLink
from crossintercom.local_broker.delivery.resolve import Target, is_group, resolve, without_relay
from crossintercom.local_broker.sessions.conn import Conn
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state.store import BrokerState, PendingEntry
from crossintercom.models import (
    ATTACHMENT_KINDS,
    Attachment,
    Message,
    Outcome,
    Peer,
    Receipt,
    SendResult,
    now_iso,
)
from crossintercom.safetext import is_one_line
from crossintercom.testhooks import crash_at, stop_at

log = logging.getLogger(__name__)

# How long an asker may still be blocked on its ask: the longest ask wait plus the operation's
# slack (docs/delivery.md: asks wait at most 10 min, an operation at most 11).
ASK_BLOCKS_S: Final = 660.0


class Operations:
    def __init__(
        self,
        settings: Settings,
        authority: DedupAuthority,
        state: BrokerState,
        registry: Registry,
        delivery: Delivery,
        relay: RelayLink,
    ) -> None:
        self.settings = settings
        self.host = settings.host_id
        self.authority = authority
        self.commits = GroupCommit(authority)
        self.state = state
        self.registry = registry
        self.delivery = delivery
        self.relay = relay
        self.limiter = RateLimiter(settings.rate_limit_count, settings.rate_limit_window_s)

    def _check_rate(self, sender_id: str, message_id: str) -> None:
        if not self.limiter.admit(sender_id, message_id):
            raise Refusal(Code.RATE_LIMITED, self.limiter.why())

    def _check_crossing(self, asker_id: str, target: Target) -> None:
        """An ask to a session that waits on an ask to this asker would block both: refused,
        pointing at the ask to answer instead (docs/agents.md#policy)."""
        waiting = self.state.open_ask_from(asker_id, target.session_id, time.time() - ASK_BLOCKS_S)
        if waiting is not None:
            raise Refusal(
                Code.CROSSING_ASK,
                f"{target.name or target.session_id}@{target.host} is waiting for your reply "
                f"to its ask {waiting}; answer it (reply with reply_to={waiting}) instead of "
                "asking back: two asks waiting on each other would both wait out their "
                "timeouts. A send is not refused",
            )

    def build_message(self, conn: Conn, body: p.OutgoingBody, to: str) -> Message:
        assert conn.session_id is not None
        info = self.registry.live[conn.session_id].info
        _one_line_fields(body)
        for a in body.attachments:
            if a.kind not in ATTACHMENT_KINDS:
                raise Refusal(
                    Code.BAD_ATTACHMENT,
                    f"attachment kind must be one of {', '.join(ATTACHMENT_KINDS)}, got {a.kind!r}",
                )
        msg = Message(
            id=body.id,
            sender=Peer(info.id, info.name, self.host),
            to=to,
            text=body.message,
            attachments=tuple(
                Attachment(a.kind, a.name, a.content, a.language) for a in body.attachments
            ),
            reply_to=body.reply_to,
            expects_reply=body.expects_reply,
            sent_at=now_iso(),
            subject=body.subject,
            thread_id=body.thread_id or body.id,
            priority=body.priority,
            ack_required=body.ack_required,
            ack_by=body.ack_by if body.ack_required else None,
        )
        if msg.size() > self.settings.max_message_bytes:
            what = "reply" if body.reply_to is not None or not to else "message"
            raise Refusal(
                Code.TOO_LARGE,
                f"{what} is {msg.size()} bytes; the limit is {self.settings.max_message_bytes}",
            )
        return msg

    async def _resolve(self, target: str, sender_id: str) -> list[Target]:
        try:
            return self._resolve_once(target, sender_id)
        except Refusal as refusal:
            if refusal.code != Code.NOT_FOUND:
                raise
            if not self.relay.connected:
                has_store = bool(self.settings.store_url)
                raise without_relay(target, refusal, host=self.host, has_store=has_store) from None
        await self.relay.refresh_roster()
        return self._resolve_once(target, sender_id)

    def _resolve_once(self, target: str, sender_id: str) -> list[Target]:
        snap = self.registry.snapshot()
        return resolve(
            target,
            sender_id,
            host=self.host,
            local=snap.local,
            remote=snap.remote,
            by_id=snap.by_id,
            by_name=snap.by_name,
        )

    async def send(self, conn: Conn, body: p.OutgoingBody) -> SendResult:
        assert conn.session_id is not None
        if not body.to:
            raise Refusal(Code.MISSING_TARGET, "a send needs a target ('to')")
        msg = self.build_message(conn, body, body.to)
        targets = await self._resolve(body.to, conn.session_id)
        group = is_group(body.to)
        if group and body.expects_reply:
            raise Refusal(Code.GROUP_ASK, "ask cannot target a group; ask one session")
        if body.expects_reply:
            self._check_crossing(conn.session_id, targets[0])
        self._check_rate(conn.session_id, msg.id)
        remote = any(not t.local for t in targets)
        answer = outcomes.lodged(await self._lodge(msg, remote), msg.id)
        if answer is not None:
            return answer
        crash_at("after_lodge")
        if msg.expects_reply:
            try:
                self.state.record_ask(msg.id, conn.session_id, targets[0].session_id)
            except sqlite3.Error as exc:
                self.authority.abandon(msg.id)
                raise _storage_refusal(exc) from None
            self.delivery.ask_waiters[msg.id] = conn
        receipts = await self._deliver_all(msg, targets)
        self.relay.archive(msg, _located(receipts, {t.session_id: t.host for t in targets}))
        crash_at("after_forward")
        result = outcomes.combine(msg.id, receipts, group=group)
        if result.outcome is Outcome.REFUSED and not group:
            self.delivery.ask_waiters.pop(msg.id, None)
        stop_at("broker_before_settle")
        await self._settle(result, remote)
        crash_at("after_accept")
        return result

    async def _lodge(self, msg: Message, remote: bool) -> Decision:
        try:
            return await self.commits.lodge(msg.id, msg.canonical_payload(), remote=remote)
        except AuthorityUnavailable as exc:
            log.error("cannot lodge the message id", extra={"id": msg.id, "error": exc.message})
            raise _storage_refusal(exc) from None

    async def _settle(self, result: SendResult, remote: bool) -> None:
        action = outcomes.settle(result.outcome, remote=remote)
        try:
            if action == "abandon":
                self.authority.abandon(result.id)
            elif action == "accept":
                await self.commits.accept(result.id, outcomes.to_retain(result))
        except AuthorityUnavailable as exc:
            # The outcome stands: the message went where ``result`` says (a full disk struck
            # after it did). Only its dedup record was not written: a resend of this id finds
            # the lodged record pending, so it is forwarded again (the store answers by id) or,
            # local, told ``uncertain``; never delivered twice.
            log.error(
                "cannot record the outcome of the message",
                extra={"id": result.id, "error": exc.message},
            )

    async def _deliver_all(self, msg: Message, targets: list[Target]) -> list[Receipt]:
        local = [t for t in targets if t.local]
        remote = [t for t in targets if not t.local]
        jobs: list[Coroutine[Any, Any, list[Receipt]]] = [self._deliver_one(msg, t) for t in local]
        if remote:
            jobs.append(self.relay.forward(msg, remote))
        parts = await asyncio.gather(*jobs)
        return [r for part in parts for r in part]

    async def _deliver_one(self, msg: Message, t: Target) -> list[Receipt]:
        return [await self.delivery.deliver(msg, t.session_id, asker_host=msg.sender.host)]

    async def reply(self, conn: Conn, body: p.OutgoingBody) -> SendResult:
        assert conn.session_id is not None
        replier = conn.session_id
        # Identity covers the frame as sent, so a retry (same reply_to or none) matches.
        probe = self.build_message(conn, body, body.to or "")
        self._check_rate(replier, body.id)
        answer = outcomes.lodged(await self._lodge(probe, False), body.id)
        if answer is not None:
            return answer
        try:
            status, entry = self.state.consume_pending(replier, body.reply_to)
        except sqlite3.Error as exc:
            self.authority.abandon(body.id)
            raise _storage_refusal(exc) from None
        if status != "ok" or entry is None:
            refused = outcomes.reply_refused(body.id, status, body.reply_to)
            await self.commits.accept(body.id, outcomes.to_retain(refused))
            return refused
        reply = self.build_message(conn, _in_thread(body, entry), entry.asker_id)
        receipt = await self._route_reply(reply, entry)
        self.relay.archive(reply, _located([receipt], {entry.asker_id: entry.asker_host}))
        if outcomes.reopens_ask(receipt.outcome):
            self.state.reopen_pending(entry.ask_id, replier)
        result = SendResult.from_receipt(receipt, reply_to=entry.ask_id)
        await self._settle(result, remote=entry.asker_host != self.host)
        return result

    async def _route_reply(self, reply: Message, entry: PendingEntry) -> Receipt:
        if entry.asker_host != self.host:
            # Only the asker's host routes a reply: hand it over by id, never by name.
            target = Target(entry.asker_id, entry.asker_host, None, local=False)
            return (await self.relay.forward(reply, [target]))[0]
        return await self.delivery.route_reply(reply, entry.asker_id)


def _one_line_fields(body: p.OutgoingBody) -> None:
    """A subject and attachment names are one line (docs/agents.md#framing)."""
    if body.subject is not None and not is_one_line(body.subject):
        raise Refusal(Code.NOT_ONE_LINE, "the subject must be one line (no line breaks)")
    if not all(is_one_line(a.name) for a in body.attachments):
        raise Refusal(Code.NOT_ONE_LINE, "an attachment's name must be one line (no line breaks)")


def _located(receipts: list[Receipt], hosts: dict[str, str]) -> list[Receipt]:
    """Receipts with their recipient's host, for the archive (a relay's answer may omit it)."""
    return [
        r
        if r.host or r.recipient not in hosts
        else msgspec.structs.replace(r, host=hosts[r.recipient])
        for r in receipts
    ]


def _in_thread(body: p.OutgoingBody, entry: PendingEntry) -> p.OutgoingBody:
    """A reply answers its ask, joins the ask's thread and, unless it says otherwise, keeps the
    ask's subject."""
    ask = entry.body
    thread = ask.get("thread_id") if isinstance(ask.get("thread_id"), str) else None
    subject = ask.get("subject") if isinstance(ask.get("subject"), str) else None
    return msgspec.structs.replace(
        body,
        reply_to=entry.ask_id,
        thread_id=thread or entry.ask_id,
        subject=body.subject or subject,
    )


def _storage_refusal(exc: BaseException) -> Refusal:
    """Nothing left this host: the sender may resend once the disk is writable again."""
    return Refusal(
        Code.LOCAL_STORAGE,
        f"this host's broker cannot write its files ({exc}); nothing was sent",
        outcome=Outcome.NOT_SENT,
    )
