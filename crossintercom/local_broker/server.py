"""The local broker: session registry, routing, presence, dedup authority, reply records.

One asyncio process per user per host, serving a Unix socket. It knows nothing about SQL or
other hosts: a connected relay (a ``control`` session) carries messages for remote targets and
hands in messages from them through the frames in ``crossintercom.protocol``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import ProtocolError
from crossintercom.local_broker.authority import DedupAuthority
from crossintercom.local_broker.state import BrokerState, PendingEntry
from crossintercom.models import (
    ATTACHMENT_KINDS,
    PURPOSES,
    Attachment,
    Message,
    Outcome,
    Peer,
    Receipt,
    SessionInfo,
    fallback_alias,
    now_iso,
    weakest,
)

log = logging.getLogger(__name__)

UUID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_ROSTER_REFRESH_WAIT_S = 2.0
# Crash points for the fault tests: a comma-separated list of names; the broker SIGKILLs itself
# when it reaches one. Test-only; never set it in a deployment.
FAULTS_ENV = "CROSSINTERCOM_FAULTS"


def crash_at(point: str) -> None:
    if point in os.environ.get(FAULTS_ENV, "").split(","):
        log.warning("fault injection: killing the process", extra={"point": point})
        os.kill(os.getpid(), signal.SIGKILL)


class Conn:
    """One client connection. A connection acts for at most one session."""

    _ids = itertools.count(1)

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.cid = next(self._ids)
        self.reader = reader
        self.writer = writer
        self.session_id: str | None = None
        self.owner = False
        self.control = False
        self.closed = False
        # message id -> future resolved by the recipient's ack (None) or its refusal code.
        self.acks: dict[str, asyncio.Future[str | None]] = {}

    def write(self, frame: dict[str, Any]) -> bool:
        """Queue a frame; False if the connection can no longer be written."""
        if self.closed or self.writer.is_closing():
            return False
        try:
            self.writer.write(p.encode(frame))
        except (OSError, RuntimeError):
            return False
        return True


@dataclass
class Live:
    info: SessionInfo
    owner: Conn | None
    attached: set[Conn] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Target:
    session_id: str
    host: str
    name: str | None
    local: bool


class Refusal(Exception):
    """Ends an operation with an outcome before anything was delivered (refused by default)."""

    def __init__(self, code: str, message: str, outcome: str = "refused") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.outcome = outcome


class Broker:
    def __init__(self, settings: Settings, authority: DedupAuthority, state: BrokerState) -> None:
        self.settings = settings
        self.host = settings.host_id
        self.authority = authority
        self.state = state
        self.conns: set[Conn] = set()
        self.live: dict[str, Live] = {}
        self.known = state.known_sessions()
        self.remote: dict[str, SessionInfo] = {}
        self.relay: Conn | None = None
        self.relay_status: str | None = None
        self.ask_waiters: dict[str, Conn] = {}
        self._fids = itertools.count(1)
        self._forwards: dict[int, asyncio.Future[list[dict[str, Any]]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self._idle_since: float | None = time.monotonic()
        self.started = time.time()

    # --- connection lifecycle ------------------------------------------------------------------

    async def handle_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        conn = Conn(reader, writer)
        self.conns.add(conn)
        self._idle_since = None
        try:
            await self._serve(conn)
        except Exception:
            log.exception("connection failed", extra={"cid": conn.cid})
        finally:
            self._retire(conn)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, conn: Conn) -> None:
        while not conn.closed:
            try:
                body = await p.read_frame(conn.reader, self.settings.max_frame_bytes)
            except p.FrameTooLarge as exc:
                conn.write(p.error_frame(exc.code, exc.message))
                return
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # a broken byte stream cannot be resynchronised: close it
            if body is None:
                return
            try:
                frame = p.decode_client_frame(body)
            except ProtocolError as exc:
                conn.write(p.error_frame(exc.code, exc.message, _request_id_of(body)))
                continue
            try:
                await self._dispatch(conn, frame)
            except ProtocolError as exc:
                conn.write(p.error_frame(exc.code, exc.message, getattr(frame, "request_id", None)))
            except Exception as exc:
                log.exception("frame handling failed", extra={"type": type(frame).__name__})
                conn.write(
                    p.error_frame(
                        "internal", f"broker error: {exc}", getattr(frame, "request_id", None)
                    )
                )

    def _retire(self, conn: Conn) -> None:
        """Forget a connection at once: its session goes offline, its pending pushes fail."""
        if conn.closed:
            return
        conn.closed = True
        self.conns.discard(conn)
        for fut in conn.acks.values():
            if not fut.done():
                fut.set_result("connection_lost")
        conn.acks.clear()
        for ask_id in [a for a, c in self.ask_waiters.items() if c is conn]:
            del self.ask_waiters[ask_id]
        if conn is self.relay:
            self.relay = None
            self.relay_status = None
            self.remote.clear()
            for forward in self._forwards.values():
                if not forward.done():
                    forward.set_exception(ConnectionError("relay disconnected"))
        sid = conn.session_id
        if sid is not None and sid in self.live:
            live = self.live[sid]
            live.attached.discard(conn)
            if live.owner is conn:
                live.owner = None
            if live.owner is None and not live.attached:
                del self.live[sid]
            self._roster_changed()
        if not conn.writer.is_closing():
            conn.writer.close()
        if not self.conns:
            self._idle_since = time.monotonic()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dispatch(self, conn: Conn, frame: p.ClientFrame) -> None:
        ftype = type(frame).__struct_config__.tag
        if conn.session_id is None and ftype not in p.ANONYMOUS_TYPES:
            raise ProtocolError(
                f"'{ftype}' needs a registered session; send 'register' first",
                code="not_registered",
            )
        if conn.control and ftype in ("send", "reply", "join", "leave", "pending"):
            # A control session (the relay) is not a mailbox: it has no entry in self.live.
            raise ProtocolError(
                f"a control session cannot send '{ftype}'; it is not a recipient",
                code="not_agent",
            )
        handler = self._handlers.get(type(frame))
        if handler is None:  # pragma: no cover - every union member has a handler
            raise ProtocolError(f"unhandled frame {ftype!r}", code="unknown_type")
        await handler(self, conn, frame)

    # --- queries --------------------------------------------------------------------------------

    async def _on_ping(self, conn: Conn, f: p.Ping) -> None:
        conn.write(
            {"type": "pong", "request_id": f.request_id, "host": self.host, "pid": os.getpid()}
        )

    async def _on_list(self, conn: Conn, f: p.ListSessions) -> None:
        sessions = [s.to_dict() for s in self._all_sessions()]
        conn.write({"type": "sessions", "request_id": f.request_id, "sessions": sessions})

    async def _on_status(self, conn: Conn, f: p.Status) -> None:
        records, nbytes = self.authority.stats()
        local = [s for s in self._local_sessions() if s.online]
        conn.write(
            {
                "type": "status",
                "request_id": f.request_id,
                "host_id": self.host,
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started, 1),
                "sessions": len(local),
                "remote_sessions": len([s for s in self.remote.values() if s.online]),
                "relay": {"connected": self.relay is not None, "store": self.relay_status},
                "queued": self.state.queue_size(),
                "dedup": {"records": records, "bytes": nbytes},
            }
        )

    async def _on_groups(self, conn: Conn, f: p.Groups) -> None:
        groups: dict[str, list[dict[str, Any]]] = {}
        for s in self._all_sessions():
            for g in s.groups:
                groups.setdefault(g, []).append(
                    {"id": s.id, "name": s.display_name, "host": s.host, "online": s.online}
                )
        out = [{"name": g, "members": m} for g, m in sorted(groups.items())]
        conn.write({"type": "groups", "request_id": f.request_id, "groups": out})

    async def _on_pending(self, conn: Conn, f: p.Pending) -> None:
        assert conn.session_id is not None
        entries = self.state.open_pending(conn.session_id)
        conn.write(
            {"type": "pending", "request_id": f.request_id, "messages": [e.body for e in entries]}
        )

    # --- registration and membership -----------------------------------------------------------

    async def _on_register(self, conn: Conn, f: p.Register) -> None:
        s = f.session
        if f.protocol != p.PROTOCOL_VERSION:
            raise ProtocolError(
                f"protocol version {f.protocol} is not supported; this broker speaks "
                f"{p.PROTOCOL_VERSION}. Upgrade the older side",
                code="protocol_mismatch",
            )
        if conn.session_id is not None:
            raise ProtocolError("this connection is already registered", code="already_registered")
        if s.purpose not in PURPOSES:
            raise ProtocolError(
                f"purpose must be one of {', '.join(PURPOSES)}, got {s.purpose!r}",
                code="invalid_purpose",
            )
        if f.mode not in ("own", "auto"):
            raise ProtocolError("mode must be 'own' or 'auto'", code="bad_field")
        if s.purpose == "control":
            if self.relay is not None:
                raise ProtocolError(
                    "a relay is already connected to this broker", code="relay_in_use"
                )
            conn.session_id, conn.control, conn.owner = s.id, True, True
            self.relay = conn
            self.relay_status = s.status
            conn.write({"type": "registered", "request_id": f.request_id, "attached": False})
            self._send_local_roster()
            return
        live = self.live.get(s.id)
        attached = False
        if live is not None and live.owner is not None:
            if f.mode == "own":
                raise ProtocolError(
                    f"session {live.info.display_name} ({s.id}) is already live on another "
                    "connection",
                    code="session_in_use",
                )
            attached = True
            live.attached.add(conn)
        else:
            info = SessionInfo(
                id=s.id,
                host=self.host,
                name=s.name,
                cwd=s.cwd,
                model=s.model,
                status=s.status,
                purpose=s.purpose,
                groups=self._initial_groups(s),
                durable=s.durable,
            )
            if live is None:
                live = self.live[s.id] = Live(info, conn)
            else:
                live.owner, live.info = conn, info
            conn.owner = True
            if s.durable:
                self.state.remember_session(s.id, s.name, list(info.groups))
                self.known[s.id] = (s.name, list(info.groups))
        conn.session_id = s.id
        for ask_id in f.awaiting:
            if self.state.ask_owner(ask_id) == s.id:
                self.ask_waiters[ask_id] = conn
        conn.write(
            {
                "type": "registered",
                "request_id": f.request_id,
                "session": live.info.to_dict(),
                "attached": attached,
            }
        )
        if conn.owner:
            self._drain_backlog(conn, s.id)
            self._roster_changed()

    def _initial_groups(self, s: p.SessionBody) -> tuple[str, ...]:
        """Groups given at registration, else those a durable session had, else 'default'."""
        if s.groups:
            return tuple(s.groups)
        known = self.known.get(s.id)
        if s.durable and known is not None and known[1]:
            return tuple(known[1])
        return ("default",)

    def _update_info(self, conn: Conn, **changes: Any) -> SessionInfo:
        assert conn.session_id is not None
        live = self.live[conn.session_id]
        data = live.info.to_dict() | changes
        live.info = SessionInfo.from_dict(data)
        if live.info.durable:
            self.state.remember_session(live.info.id, live.info.name, list(live.info.groups))
            self.known[live.info.id] = (live.info.name, list(live.info.groups))
        self._roster_changed()
        return live.info

    async def _on_join(self, conn: Conn, f: p.Join) -> None:
        groups = self.live[conn.session_id].info.groups if conn.session_id else ()
        info = self._update_info(conn, groups=list(dict.fromkeys((*groups, f.group))))
        conn.write({"type": "ok", "request_id": f.request_id, "groups": list(info.groups)})

    async def _on_leave(self, conn: Conn, f: p.Leave) -> None:
        groups = self.live[conn.session_id].info.groups if conn.session_id else ()
        info = self._update_info(conn, groups=[g for g in groups if g != f.group])
        conn.write({"type": "ok", "request_id": f.request_id, "groups": list(info.groups)})

    async def _on_set_status(self, conn: Conn, f: p.SetStatus) -> None:
        if conn.control:
            self.relay_status = f.status
            conn.write({"type": "ok", "request_id": f.request_id})
            return
        self._update_info(conn, status=f.status)
        conn.write({"type": "ok", "request_id": f.request_id})

    # --- sessions and resolution ----------------------------------------------------------------

    def _local_sessions(self) -> list[SessionInfo]:
        out = [lv.info for lv in self.live.values() if lv.info.purpose == "agent"]
        for sid, (name, groups) in self.known.items():
            if sid not in self.live:
                out.append(
                    SessionInfo(
                        id=sid,
                        host=self.host,
                        name=name,
                        groups=tuple(groups),
                        durable=True,
                        online=False,
                    )
                )
        return out

    def _all_sessions(self) -> list[SessionInfo]:
        return self._local_sessions() + list(self.remote.values())

    async def _resolve(self, target: str, sender_id: str) -> list[Target]:
        try:
            return self._resolve_once(target, sender_id)
        except Refusal as refusal:
            if refusal.code != "not_found":
                raise
            if self.relay is None:
                raise self._without_relay(target, refusal) from None
        await self._refresh_roster()
        return self._resolve_once(target, sender_id)

    def _without_relay(self, target: str, refusal: Refusal) -> Refusal:
        """Not found here and no relay to ask: other hosts could not be searched.

        A target on another host, or any target on a host configured for a shared store, is
        `not_sent` (safe to resend once the relay runs); with no store it is simply not found.
        """
        _, _, host = target.partition("@")
        if (host and host != self.host) or self.settings.store_url:
            return Refusal(
                "no_relay",
                f"{target!r} is not on this host and no relay is connected to reach other "
                "hosts; nothing was sent",
                outcome="not_sent",
            )
        return refusal

    def _resolve_once(self, target: str, sender_id: str) -> list[Target]:
        local = self._local_sessions()
        remote = list(self.remote.values())

        def as_target(s: SessionInfo) -> Target:
            return Target(s.id, s.host, s.name, s.host == self.host)

        if target.startswith("group:"):
            group = target[len("group:") :]
            members = [
                as_target(s) for s in local + remote if group in s.groups and s.id != sender_id
            ]
            if not members:
                raise Refusal("not_found", f"group {group!r} has no members")
            return members
        if UUID_RE.match(target):
            for s in local + remote:
                if s.id == target:
                    return [as_target(s)]
            raise Refusal("not_found", f"no session with id {target}")
        name, _, host = target.partition("@")
        if host:
            pool = local if host == self.host else [s for s in remote if s.host == host]
            found = [s for s in pool if s.name == name or fallback_alias(s.id) == name]
            if len(found) == 1:
                return [as_target(found[0])]
            if not found:
                raise Refusal("not_found", f"no session named {name!r} on host {host!r}")
            raise Refusal(
                "ambiguous",
                f"{len(found)} sessions named {name!r} on {host!r}; use a session id: "
                + ", ".join(s.id for s in found),
            )
        levels = [
            [s for s in local if s.online],
            [s for s in local if not s.online],
            [s for s in remote if s.online],
            [s for s in remote if not s.online],
        ]
        for level in levels:
            found = [s for s in level if s.name == target or fallback_alias(s.id) == target]
            if len(found) == 1:
                return [as_target(found[0])]
            if len(found) > 1:
                raise Refusal(
                    "ambiguous",
                    f"{target!r} matches several sessions; use one of: "
                    # NAME@HOSTID alone cannot tell two same-host sessions apart: add the id.
                    + ", ".join(f"{s.name}@{s.host} (id {s.id})" for s in found),
                )
        raise Refusal("not_found", f"no session named {target!r}")

    # --- sending --------------------------------------------------------------------------------

    def _build_message(self, conn: Conn, body: p.OutgoingBody, to: str) -> Message:
        assert conn.session_id is not None
        info = self.live[conn.session_id].info
        for a in body.attachments:
            if a.kind not in ATTACHMENT_KINDS:
                raise Refusal(
                    "bad_attachment",
                    f"attachment kind must be one of {', '.join(ATTACHMENT_KINDS)}, got {a.kind!r}",
                )
        return Message(
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
        )

    async def _on_send(self, conn: Conn, f: p.Send) -> None:
        self._spawn(self._answer(conn, f.request_id, f.message.id, self._send(conn, f.message)))

    async def _on_reply(self, conn: Conn, f: p.Reply) -> None:
        self._spawn(self._answer(conn, f.request_id, f.message.id, self._reply(conn, f.message)))

    async def _answer(
        self,
        conn: Conn,
        request_id: int,
        message_id: str,
        work: Coroutine[Any, Any, dict[str, Any]],
    ) -> None:
        try:
            result = await work
        except Refusal as r:
            result = {"id": message_id, "outcome": r.outcome, "code": r.code, "message": r.message}
        except Exception as exc:
            log.exception("send failed", extra={"id": message_id})
            result = {
                "id": message_id,
                "outcome": "unknown",
                "code": "internal",
                "message": str(exc),
            }
        conn.write({"type": "result", "request_id": request_id, **result})

    async def _send(self, conn: Conn, body: p.OutgoingBody) -> dict[str, Any]:
        assert conn.session_id is not None
        if not body.to:
            raise Refusal("missing_target", "a send needs a target ('to')")
        msg = self._build_message(conn, body, body.to)
        if msg.size() > self.settings.max_message_bytes:
            raise Refusal(
                "too_large",
                f"message is {msg.size()} bytes; the limit is {self.settings.max_message_bytes}",
            )
        targets = await self._resolve(body.to, conn.session_id)
        group = body.to.startswith("group:")
        if group and body.expects_reply:
            raise Refusal("group_ask", "ask cannot target a group; ask one session")
        remote = any(not t.local for t in targets)
        decision = self._reserve(msg, remote)
        if decision is not None:
            return decision
        crash_at("after_reserve")
        if msg.expects_reply:
            self.state.record_ask(msg.id, conn.session_id)
            self.ask_waiters[msg.id] = conn
        receipts = await self._deliver_all(msg, targets)
        crash_at("after_forward")
        outcome = weakest([r.outcome for r in receipts])
        result: dict[str, Any] = {"id": msg.id, "outcome": outcome.value}
        if group:
            result["receipts"] = [r.to_dict() for r in receipts]
        else:
            r = receipts[0]
            if r.code:
                result["code"] = r.code
            if r.message:
                result["message"] = r.message
        if outcome is Outcome.REFUSED and not group:
            self.ask_waiters.pop(msg.id, None)
        self._settle(msg.id, outcome, result, remote)
        crash_at("after_accept")
        return result

    def _reserve(self, msg: Message, remote: bool) -> dict[str, Any] | None:
        """Dedup check before anything is forwarded; a dict is the answer to return as is."""
        d = self.authority.reserve(msg.id, msg.canonical_payload(), remote=remote)
        if d.kind in ("new", "forward_again"):
            return None
        if d.kind == "retained":
            return dict(d.outcome or {"id": msg.id, "outcome": "unknown"})
        if d.kind == "conflict":
            raise Refusal(
                "payload_conflict", f"message id {msg.id} was already used for another payload"
            )
        if d.kind == "over_capacity":
            raise Refusal(
                "over_capacity",
                "too many operations awaiting confirmation on this host; try again shortly",
            )
        return {
            "id": msg.id,
            "outcome": "unknown",
            "code": "uncertain",
            "message": "an earlier attempt with this id was interrupted; it may have been "
            "delivered. Do not resend automatically; check with the recipient",
        }

    def _settle(self, msg_id: str, outcome: Outcome, result: dict[str, Any], remote: bool) -> None:
        if outcome is Outcome.NOT_SENT:
            self.authority.abandon(msg_id)  # nothing went out: a retry may go through
        elif outcome is Outcome.UNKNOWN and remote:
            pass  # keep the bare reservation: a retry is forwarded and the store answers by id
        else:
            self.authority.accept(msg_id, result)

    async def _deliver_all(self, msg: Message, targets: list[Target]) -> list[Receipt]:
        local = [t for t in targets if t.local]
        remote = [t for t in targets if not t.local]
        jobs: list[Coroutine[Any, Any, list[Receipt]]] = [self._deliver_one(msg, t) for t in local]
        if remote:
            jobs.append(self._forward(msg, remote))
        parts = await asyncio.gather(*jobs)
        return [r for part in parts for r in part]

    async def _deliver_one(self, msg: Message, t: Target) -> list[Receipt]:
        return [await self.deliver_local(msg, t.session_id, asker_host=msg.sender.host)]

    async def deliver_local(self, msg: Message, rid: str, *, asker_host: str) -> Receipt:
        """Hand a message to a local session: delivered on its ack, else queued if durable."""
        if msg.expects_reply:
            # Recorded before the push so a fast reply is authorised; dropped if nothing lands.
            self.state.add_pending(msg.id, rid, msg.sender.id, asker_host, msg.to_dict())
        live = self.live.get(rid)
        status = "offline"
        if live is not None and live.owner is not None:
            status = await self._push(live.owner, msg)
            if status == "acked":
                return Receipt(msg.id, Outcome.DELIVERED, rid)
            if status not in ("connection_lost", "timeout"):
                if msg.expects_reply:
                    self.state.drop_pending(msg.id, rid)
                return Receipt(msg.id, Outcome.REFUSED, rid, status, "the recipient refused it")
        if rid in self.known:
            self.state.enqueue(rid, "message", msg.id, msg.to_dict(), self.settings.retention_s)
            return Receipt(msg.id, Outcome.QUEUED, rid)
        if msg.expects_reply:
            self.state.drop_pending(msg.id, rid)
        if status == "timeout":
            return Receipt(
                msg.id,
                Outcome.UNKNOWN,
                rid,
                "no_ack",
                "the recipient did not confirm in time; do not resend automatically",
            )
        return Receipt(msg.id, Outcome.NOT_SENT, rid, "recipient_gone", "the recipient left")

    async def _push(
        self, conn: Conn, msg: Message, flags: tuple[str, ...] = (), *, reply: bool = False
    ) -> str:
        """Write a deliver frame and wait for the ack: 'acked', a refusal code, or a failure."""
        fut = conn.acks.get(msg.id)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            conn.acks[msg.id] = fut
        body = msg.with_flags(*flags).to_dict() if flags else msg.to_dict()
        frame: dict[str, Any] = {"type": "deliver", "message": body}
        if reply:
            frame["reply"] = True  # answers an ask: the client returns it to the waiting call
        if not conn.write(frame):
            self._retire(conn)
            return "connection_lost"
        try:
            await asyncio.wait_for(conn.writer.drain(), self.settings.ack_timeout_s)
        except OSError:  # TimeoutError included: a client that stops reading cannot be written
            self._retire(conn)  # a write that fails retires the session at once
            return "connection_lost"
        try:
            code = await asyncio.wait_for(asyncio.shield(fut), self.settings.ack_timeout_s)
        except TimeoutError:  # written, but not acknowledged in time: the session stays
            conn.acks.pop(msg.id, None)
            return "timeout"
        return "acked" if code is None else code

    async def _on_ack(self, conn: Conn, f: p.Ack) -> None:
        fut = conn.acks.pop(f.id, None)
        if fut is None:
            conn.write(p.error_frame("unexpected_ack", f"no delivery of {f.id} awaits an ack"))
            return
        if not fut.done():
            fut.set_result(f.refused)

    async def _on_confirm(self, conn: Conn, f: p.Confirm) -> None:
        self.authority.release_many(f.ids)

    # --- resume ---------------------------------------------------------------------------------

    def _drain_backlog(self, conn: Conn, sid: str) -> None:
        items = self.state.backlog(sid)
        if not items:
            return
        # Written synchronously, before anything else can run, so the backlog precedes any new
        # message in the stream; acks are awaited afterwards.
        waits: list[tuple[int, asyncio.Future[str | None]]] = []
        for item in items:
            if item.kind == "receipt":
                fut = asyncio.get_running_loop().create_future()
                conn.acks[item.item_id] = fut
                # The key makes the client ack it, so it is dequeued (and stops holding up the
                # rest of the backlog); item_id is the key _notify_sender queued it under.
                conn.write(
                    {"type": "notice", "kind": "receipt", "key": item.item_id, "receipt": item.body}
                )
            else:
                msg = Message.from_dict(item.body)
                flags = ["resumed"]
                if not self._sender_online(msg.sender):
                    flags.append("sender_gone")
                fut = asyncio.get_running_loop().create_future()
                conn.acks[msg.id] = fut
                frame: dict[str, Any] = {
                    "type": "deliver",
                    "message": msg.with_flags(*flags).to_dict(),
                }
                if msg.reply_to is not None and self.state.ask_owner(msg.reply_to) == sid:
                    frame["reply"] = True
                conn.write(frame)
            waits.append((item.seq, fut))
        self._spawn(self._await_backlog(waits))

    async def _await_backlog(self, waits: list[tuple[int, asyncio.Future[str | None]]]) -> None:
        for seq, fut in waits:
            try:
                code = await asyncio.wait_for(fut, self.settings.ack_timeout_s * 3)
            except TimeoutError:
                return  # left queued; the next registration hands it over again
            if code == "connection_lost":
                return
            self.state.dequeue(seq)

    def _sender_online(self, sender: Peer) -> bool:
        if sender.host == self.host:
            live = self.live.get(sender.id)
            return live is not None
        s = self.remote.get(sender.id)
        return s is not None and s.online

    # --- replies --------------------------------------------------------------------------------

    async def _reply(self, conn: Conn, body: p.OutgoingBody) -> dict[str, Any]:
        assert conn.session_id is not None
        replier = conn.session_id
        # Identity covers the frame as sent, so a retry (same reply_to or none) matches.
        probe = self._build_message(conn, body, body.to or "")
        if probe.size() > self.settings.max_message_bytes:
            raise Refusal(
                "too_large",
                f"reply is {probe.size()} bytes; the limit is {self.settings.max_message_bytes}",
            )
        decision = self._reserve(probe, remote=False)
        if decision is not None:
            return decision
        status, entry = self.state.consume_pending(replier, body.reply_to)
        if status != "ok" or entry is None:
            if status == "already":
                result = {
                    "id": body.id,
                    "outcome": "refused",
                    "code": "already_replied",
                    "message": f"ask {body.reply_to} was already answered",
                }
            elif body.reply_to:
                result = {
                    "id": body.id,
                    "outcome": "refused",
                    "code": "reply_not_authorised",
                    "message": f"no ask {body.reply_to} was delivered to you",
                }
            else:
                result = {
                    "id": body.id,
                    "outcome": "refused",
                    "code": "reply_not_authorised",
                    "message": "no ask is waiting for your reply",
                }
            self.authority.accept(body.id, result)
            return result
        msg = msgspec.structs.replace(body, reply_to=entry.ask_id)
        reply = self._build_message(conn, msg, entry.asker_id)
        receipt = await self._route_reply(reply, entry)
        if receipt.outcome in (Outcome.NOT_SENT, Outcome.UNKNOWN):
            self.state.reopen_pending(entry.ask_id, replier)
        result = {"id": reply.id, "outcome": receipt.outcome.value, "reply_to": entry.ask_id}
        if receipt.code:
            result["code"] = receipt.code
        if receipt.message:
            result["message"] = receipt.message
        self._settle(reply.id, receipt.outcome, result, remote=entry.asker_host != self.host)
        return result

    async def _route_reply(self, reply: Message, entry: PendingEntry) -> Receipt:
        if entry.asker_host != self.host:
            # Only the asker's host routes a reply: hand it over by id, never by name.
            target = Target(entry.asker_id, entry.asker_host, None, local=False)
            return (await self._forward(reply, [target]))[0]
        return await self.route_reply_local(reply, entry.asker_id)

    async def route_reply_local(self, reply: Message, asker_id: str) -> Receipt:
        """To the connection waiting on the ask, else the asker's session, else its queue."""
        assert reply.reply_to is not None
        waiter = self.ask_waiters.get(reply.reply_to)
        if waiter is not None and not waiter.closed:
            status = await self._push(waiter, reply, reply=True)
            if status == "acked":
                self.ask_waiters.pop(reply.reply_to, None)
                return Receipt(reply.id, Outcome.DELIVERED, asker_id)
        live = self.live.get(asker_id)
        if live is not None and live.owner is not None and live.owner is not waiter:
            status = await self._push(live.owner, reply, reply=True)
            if status == "acked":
                return Receipt(reply.id, Outcome.DELIVERED, asker_id)
        if asker_id in self.known:
            self.state.enqueue(
                asker_id, "message", reply.id, reply.to_dict(), self.settings.retention_s
            )
            return Receipt(reply.id, Outcome.QUEUED, asker_id)
        return Receipt(
            reply.id,
            Outcome.REFUSED,
            asker_id,
            "asker_gone",
            "the asking session has left and keeps no mailbox",
        )

    # --- relay side -----------------------------------------------------------------------------

    async def _forward(self, msg: Message, targets: list[Target]) -> list[Receipt]:
        relay = self.relay
        if relay is None:
            return [
                Receipt(
                    msg.id,
                    Outcome.NOT_SENT,
                    t.session_id,
                    "no_relay",
                    "no relay is connected on this host; nothing was sent",
                )
                for t in targets
            ]
        fid = next(self._fids)
        fut: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._forwards[fid] = fut
        relay.write(
            {
                "type": "forward",
                "fid": fid,
                "message": msg.to_dict(),
                "recipients": [{"session": t.session_id, "host": t.host} for t in targets],
            }
        )
        try:
            raw = await asyncio.wait_for(fut, self.settings.remote_ack_wait_s + 10.0)
            return [Receipt.from_dict(r) for r in raw]
        except (TimeoutError, ConnectionError):
            return [
                Receipt(
                    msg.id,
                    Outcome.UNKNOWN,
                    t.session_id,
                    "relay_lost",
                    "the relay stopped answering; do not resend automatically",
                )
                for t in targets
            ]
        finally:
            self._forwards.pop(fid, None)

    async def _on_forward_result(self, conn: Conn, f: p.ForwardResult) -> None:
        self._require_relay(conn)
        fut = self._forwards.get(f.fid)
        if fut is not None and not fut.done():
            fut.set_result(f.receipts)

    async def _refresh_roster(self) -> None:
        if self.relay is None:
            return
        fid = next(self._fids)
        fut: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._forwards[fid] = fut
        self.relay.write({"type": "refresh_roster", "fid": fid})
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(fut, _ROSTER_REFRESH_WAIT_S)
        self._forwards.pop(fid, None)

    async def _on_roster_refreshed(self, conn: Conn, f: p.RosterRefresh) -> None:
        self._require_relay(conn)
        fut = self._forwards.get(f.fid)
        if fut is not None and not fut.done():
            fut.set_result([])

    async def _on_remote_roster(self, conn: Conn, f: p.RemoteRoster) -> None:
        self._require_relay(conn)
        remote: dict[str, SessionInfo] = {}
        for raw in f.sessions:
            try:
                info = SessionInfo.from_dict(raw)
            except (KeyError, TypeError, ValueError):
                continue  # one bad row must not hide the others
            if info.host != self.host:
                remote[info.id] = info
        self.remote = remote
        if f.request_id is not None:
            conn.write({"type": "ok", "request_id": f.request_id})

    async def _on_inbound(self, conn: Conn, f: p.Inbound) -> None:
        self._require_relay(conn)
        self._spawn(self._inbound(conn, f))

    async def _inbound(self, conn: Conn, f: p.Inbound) -> None:
        try:
            msg = Message.from_dict(f.message)
        except (KeyError, TypeError, ValueError) as exc:
            conn.write(
                {
                    "type": "result",
                    "request_id": f.request_id,
                    "id": f.message.get("id"),
                    "outcome": "refused",
                    "code": "bad_message",
                    "message": str(exc),
                }
            )
            return
        if msg.reply_to is not None and self.state.ask_owner(msg.reply_to) == f.recipient:
            receipt = await self.route_reply_local(msg, f.recipient)
        elif f.recipient in self.live or f.recipient in self.known:
            receipt = await self.deliver_local(msg, f.recipient, asker_host=msg.sender.host)
        else:
            receipt = Receipt(
                msg.id, Outcome.REFUSED, f.recipient, "not_found", "no such session on this host"
            )
        conn.write({"type": "result", "request_id": f.request_id, **receipt.to_dict()})

    async def _on_remote_receipt(self, conn: Conn, f: p.RemoteReceipt) -> None:
        self._require_relay(conn)
        for raw in f.receipts:
            sender = raw.get("sender")
            if isinstance(sender, str):
                self._notify_sender(sender, {k: v for k, v in raw.items() if k != "sender"})

    def _notify_sender(self, sender_id: str, receipt: dict[str, Any]) -> None:
        """A receipt for a sender on this host: shown live, or queued for its return."""
        live = self.live.get(sender_id)
        key = f"{receipt.get('id')}:{receipt.get('recipient') or ''}:{receipt.get('outcome')}"
        durable = sender_id in self.known
        if durable:
            # Queued first: a live push whose connection dies before the ack is not lost.
            self.state.enqueue(sender_id, "receipt", key, receipt, self.settings.retention_s)
        if live is not None and live.owner is not None:
            conn = live.owner
            fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            conn.acks[key] = fut
            notice = {"type": "notice", "kind": "receipt", "key": key, "receipt": receipt}
            if conn.write(notice) and durable:
                self._spawn(self._dequeue_on_ack(sender_id, key, fut))

    async def _dequeue_on_ack(
        self, sender_id: str, key: str, fut: asyncio.Future[str | None]
    ) -> None:
        with contextlib.suppress(TimeoutError):
            if await asyncio.wait_for(fut, self.settings.ack_timeout_s) is None:
                self.state.dequeue_item(sender_id, "receipt", key)

    def _require_relay(self, conn: Conn) -> None:
        if conn is not self.relay:
            raise ProtocolError("only the relay may send this frame", code="not_relay")

    def _roster_changed(self) -> None:
        if self.relay is not None:
            self._send_local_roster()

    def _send_local_roster(self) -> None:
        if self.relay is not None:
            self.relay.write(
                {"type": "local_roster", "sessions": [s.to_dict() for s in self._local_sessions()]}
            )

    # --- housekeeping ---------------------------------------------------------------------------

    async def housekeeping(self) -> None:
        last_sweep = 0.0
        while not self._stop.is_set():
            await asyncio.sleep(0.2)
            now = time.monotonic()
            if self._idle_since is not None and now - self._idle_since >= self.settings.idle_exit_s:
                log.info("idle: exiting")
                self._stop.set()
                return
            if now - last_sweep >= self.settings.sweep_interval_s:
                last_sweep = now
                self.authority.sweep()
                self.state.forget_old()
                for item in self.state.take_expired():
                    if item.kind != "message":
                        continue
                    msg = Message.from_dict(item.body)
                    receipt = {
                        "id": msg.id,
                        "outcome": "expired",
                        "recipient": item.recipient,
                        "code": "expired",
                        "message": "not collected within the retention",
                    }
                    if msg.sender.host == self.host:
                        self._notify_sender(msg.sender.id, receipt)
                    log.info("message expired", extra={"id": msg.id, "recipient": item.recipient})

    def stop(self) -> None:
        self._stop.set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    _handlers: dict[type, Callable[[Broker, Conn, Any], Coroutine[Any, Any, None]]] = {
        p.Register: _on_register,
        p.Send: _on_send,
        p.Reply: _on_reply,
        p.Ack: _on_ack,
        p.Confirm: _on_confirm,
        p.ListSessions: _on_list,
        p.Status: _on_status,
        p.Groups: _on_groups,
        p.Join: _on_join,
        p.Leave: _on_leave,
        p.SetStatus: _on_set_status,
        p.Pending: _on_pending,
        p.Ping: _on_ping,
        p.RemoteRoster: _on_remote_roster,
        p.Inbound: _on_inbound,
        p.ForwardResult: _on_forward_result,
        p.RemoteReceipt: _on_remote_receipt,
        p.RosterRefresh: _on_roster_refreshed,
    }


def _request_id_of(body: bytes) -> int | None:
    """Best effort: echo the request id of a frame that failed validation."""
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    rid = obj.get("request_id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else None
