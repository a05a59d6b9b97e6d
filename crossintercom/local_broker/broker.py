"""The broker's orchestration: one handler per frame type over the rooms that do the work.

Rooms: ``sessions.registry`` (sessions), ``registration`` (register), and in ``delivery``:
``resolve`` (targets, pure), ``outcomes`` (rules, pure), ``local`` (push, ack, queue, backlog,
receipts), ``handover`` (messages from other hosts), ``relay_link`` (the relay). The handlers of
the query frames (``queries.Queries``) and of the coordination frames (``coord.handlers``'s
``Coordination``) work on the rooms it gives them, and join its table. It knows nothing about
SQL or other hosts: the relay carries messages for remote targets and hands in messages from them
(docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import time
from collections.abc import Callable, Coroutine
from typing import Any

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import Code, ProtocolError
from crossintercom.local_broker.authority.dedup import AuthorityUnavailable, DedupAuthority
from crossintercom.local_broker.coord.acks import AckBook
from crossintercom.local_broker.coord.aftercare import Aftercare
from crossintercom.local_broker.coord.deadletters import DeadLetterBook
from crossintercom.local_broker.coord.handlers import Coordination
from crossintercom.local_broker.coord.inbound_policy import InboundPolicy
from crossintercom.local_broker.coord.reservations import ReservationDesk
from crossintercom.local_broker.coord.retirement import retire_idle
from crossintercom.local_broker.delivery.handover import Handover
from crossintercom.local_broker.delivery.local import Delivery
from crossintercom.local_broker.delivery.outcomes import Refusal
from crossintercom.local_broker.delivery.relay_link import RelayLink
from crossintercom.local_broker.delivery.sending import Operations
from crossintercom.local_broker.delivery.traffic import Traffic
from crossintercom.local_broker.health import Health
from crossintercom.local_broker.queries import Queries
from crossintercom.local_broker.registration import Registration
from crossintercom.local_broker.sessions.conn import Conn, Handler, Push
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import (
    MAX_GROUPS,
    POSSIBLE_REPEAT,
    Outcome,
    Peer,
    Receipt,
    SendResult,
    SessionInfo,
)
from crossintercom.safetext import is_one_line

log = logging.getLogger(__name__)

Method = Callable[["Broker", Conn, Any], Coroutine[Any, Any, None]]


class Broker:
    def __init__(self, settings: Settings, authority: DedupAuthority, state: BrokerState) -> None:
        self.settings = settings
        self.host = settings.host_id
        self.authority = authority
        self.state = state
        self.conns: set[Conn] = set()
        self.registry = Registry(self.host, state)
        self.health = Health(settings.home)
        self.relay = RelayLink(settings, self.registry)
        self.delivery = Delivery(
            settings, self.registry, state, retire=self.retire, spawn=self.spawn
        )
        self.ops = Operations(settings, authority, state, self.registry, self.delivery, self.relay)
        self.aftercare = Aftercare(self.host, self.registry, state, self.delivery, self.relay)
        self.registration = Registration(self.host, self.registry, state, self.delivery, self.relay)
        self.handover = Handover(self.registry, state, self.delivery, self.ops.limiter)
        self.traffic = Traffic(self.registry)
        self.acks = self.aftercare.acks = AckBook(state, settings.retention_s)
        self.dead = self.aftercare.dead = DeadLetterBook(state, settings.retention_s)
        self.inbound = self.aftercare.inbound = InboundPolicy(state, self.registry)
        self.reservations = ReservationDesk(self.relay, settings)
        self.delivery.screen = self.inbound.screen
        self.relay.traffic = self.delivery.traffic = self.traffic
        self.traffic.archive_copy = self.relay.archive
        self.queries = Queries(
            self.host,
            authority,
            state,
            self.registry,
            self.relay,
            self.health,
            self.delivery,
            self.inbound,
            self.dead,
        )
        self.coord = Coordination(
            self.registry,
            self.aftercare,
            self.acks,
            self.dead,
            self.inbound,
            self.delivery,
            self.reservations,
            send=self._send,
            spawn=self.spawn,
        )
        self._table: dict[type, Handler] = {
            **{t: functools.partial(m, self) for t, m in self._methods.items()},
            **self.queries.handlers,
            **self.coord.handlers,
        }
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self.idle_since: float | None = time.monotonic()

    # --- connections ----------------------------------------------------------------------------

    def open(self, conn: Conn) -> None:
        self.conns.add(conn)
        self.idle_since = None

    def retire(self, conn: Conn) -> None:
        """Forget a connection at once: its session goes offline, its pending pushes fail."""
        if conn.closed:
            return
        conn.closed = True
        self.conns.discard(conn)
        for fut in conn.acks.values():
            if not fut.done():
                fut.set_result(Push.CONNECTION_LOST)
        conn.acks.clear()
        self.delivery.forget_conn(conn)
        self.health.reported(conn, conn.session_id, [])
        self.relay.detach(conn)
        if self.registry.detach(conn):
            self.relay.send_local_roster()
        if not conn.writer.is_closing():
            conn.out.flush()  # what this turn still held for it (an error frame) goes first
            conn.writer.close()
        if not self.conns:
            self.idle_since = time.monotonic()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def dispatch(self, conn: Conn, frame: p.ToBroker) -> None:
        """The gate: who may send what, then the frame's handler."""
        ftype = type(frame).__struct_config__.tag
        assert isinstance(ftype, str)
        self.gate(conn, ftype)
        await self._table[type(frame)](conn, frame)

    def gate(self, conn: Conn, ftype: str) -> None:
        if conn.session_id is None and ftype not in p.ANONYMOUS_TYPES:
            raise ProtocolError(
                f"'{ftype}' needs a registered session; send 'register' first",
                code=Code.NOT_REGISTERED,
            )
        if ftype in p.RELAY_TYPES:
            self.relay.require(conn)
        if conn.control and ftype in p.MAILBOX_TYPES:
            # A control session (the relay) is not a mailbox: it has no entry in the registry.
            raise ProtocolError(
                f"a control session cannot send '{ftype}'; it is not a recipient",
                code=Code.NOT_AGENT,
            )

    # --- registration and membership -----------------------------------------------------------

    async def _on_register(self, conn: Conn, f: p.Register) -> None:
        self.registration.register(conn, f)

    def _update_info(self, conn: Conn, **changes: Any) -> SessionInfo:
        assert conn.session_id is not None
        info = self.registry.update(conn.session_id, **changes)
        self.relay.send_local_roster()
        return info

    def _groups_of(self, conn: Conn) -> tuple[str, ...]:
        assert conn.session_id is not None
        return self.registry.live[conn.session_id].info.groups

    async def _on_join(self, conn: Conn, f: p.Join) -> None:
        groups = tuple(dict.fromkeys((*self._groups_of(conn), f.group)))
        if len(groups) > MAX_GROUPS:
            raise ProtocolError(
                f"a session may be in at most {MAX_GROUPS} groups; leave one first",
                code=Code.OVER_CAPACITY,
            )
        info = self._update_info(conn, groups=groups)
        conn.write(p.Ok(f.request_id, groups=list(info.groups)))

    async def _on_leave(self, conn: Conn, f: p.Leave) -> None:
        groups = tuple(g for g in self._groups_of(conn) if g != f.group)
        info = self._update_info(conn, groups=groups)
        conn.write(p.Ok(f.request_id, groups=list(info.groups)))

    async def _on_set_status(self, conn: Conn, f: p.SetStatus) -> None:
        if f.status is not None and not is_one_line(f.status):
            raise ProtocolError("a status must be one line", code=Code.NOT_ONE_LINE)
        if conn.control:
            self.relay.store_status = f.status
        else:
            self._update_info(conn, status=f.status)
        conn.write(p.Ok(f.request_id))

    async def _on_set_wake(self, conn: Conn, f: p.SetWake) -> None:
        info = self.aftercare.set_wake(conn, f.wake)
        conn.write(p.Sessions(f.request_id, [info]))

    async def _on_shown(self, conn: Conn, f: p.Shown) -> None:
        self.aftercare.shown(conn, f)

    async def _on_inbox_fault(self, conn: Conn, f: p.InboxFault) -> None:
        assert conn.session_id is not None
        self.health.reported(conn, conn.session_id, f.faults)

    async def _on_forget(self, conn: Conn, f: p.Forget) -> None:
        conn.write(self.aftercare.forget(f))

    # --- sending ---------------------------------------------------------------------------

    async def _on_send(self, conn: Conn, f: p.Send) -> None:
        if f.wait_s is not None and f.message.expects_reply:
            self.traffic.wait(f.message.id, f.wait_s)
        self._send(conn, f.request_id, f.message)

    def _send(self, conn: Conn, request_id: int, body: p.OutgoingBody) -> None:
        """A send (or a resend) taken on: answered when its work is done."""
        self.ops.commits.busy += 1  # counted from its arrival: see GroupCommit
        self.spawn(self._answer(conn, request_id, body, self.ops.send(conn, body)))

    async def _on_reply(self, conn: Conn, f: p.Reply) -> None:
        self.ops.commits.busy += 1
        self.spawn(self._answer(conn, f.request_id, f.message, self.ops.reply(conn, f.message)))

    async def _answer(
        self,
        conn: Conn,
        request_id: int,
        body: p.OutgoingBody,
        work: Coroutine[Any, Any, SendResult],
    ) -> None:
        message_id = body.id
        try:
            result = await work
        except Refusal as r:
            result = r.result(message_id)
        except Exception as exc:
            log.exception("send failed", extra={"id": message_id})
            result = SendResult(message_id, Outcome.UNKNOWN, Code.INTERNAL, str(exc))
        finally:
            self.ops.commits.busy -= 1
        conn.write(p.Result.of(request_id, result))
        if conn.session_id is not None:
            try:
                self.dead.sent(conn.session_id, body, result)
                if body.ack_required and result.outcome in _ARRIVING:
                    self.acks.expect(conn.session_id, body)
            except sqlite3.Error as exc:  # a full disk: the send stands, its notes are lost
                log.error("cannot note the send: %s", exc, extra={"id": message_id})
        if result.outcome in _WENT_NOWHERE:
            self._went_nowhere(conn, body, result)

    def _went_nowhere(self, conn: Conn, body: p.OutgoingBody, result: SendResult) -> None:
        """A refused send is traffic too: the overseer page shows it with its code."""
        sid = conn.session_id
        live = self.registry.live.get(sid) if sid is not None else None
        if sid is not None:
            name = live.info.display_name if live is not None else None
            self.traffic.refused(Peer(sid, name, self.host), body, result)

    async def _on_ack(self, conn: Conn, f: p.Ack) -> None:
        fut = conn.acks.pop(f.id, None)
        if fut is None:
            conn.write(p.Error(Code.UNEXPECTED_ACK, f"no delivery of {f.id} awaits an ack"))
            return
        if not fut.done():
            fut.set_result(f.refused)
        self.health.acked(conn.session_id, f.refused)

    async def _on_confirm(self, conn: Conn, f: p.Confirm) -> None:
        self.authority.discard_many(f.ids)

    # --- frames from the relay ------------------------------------------------------------------

    async def _on_forward_result(self, conn: Conn, f: p.ForwardResult) -> None:
        self.relay.forward_result(f)

    async def _on_roster_refreshed(self, conn: Conn, f: p.RosterRefreshed) -> None:
        self.relay.roster_refreshed(f)

    async def _on_remote_roster(self, conn: Conn, f: p.RemoteRoster) -> None:
        self.registry.set_remote(f.sessions)
        if f.request_id is not None:
            conn.write(p.Ok(f.request_id))

    async def _on_inbound(self, conn: Conn, f: p.Inbound) -> None:
        self.spawn(self._inbound(conn, f))

    async def _inbound(self, conn: Conn, f: p.Inbound) -> None:
        receipt = await self.handover.receive(f.message, f.recipient)
        conn.write(p.Result.of_receipt(f.request_id, receipt))
        self.relay.archive(f.message, [receipt])  # the recipient's host saw it too

    async def _on_inbound_batch(self, conn: Conn, f: p.InboundBatch) -> None:
        self.spawn(self._inbound_batch(conn, f))

    async def _inbound_batch(self, conn: Conn, f: p.InboundBatch) -> None:
        msgs = f.messages
        if f.repeats:
            repeats = set(f.repeats)
            msgs = [m.with_flags(POSSIBLE_REPEAT) if m.id in repeats else m for m in msgs]
        receipts = await self.handover.receive_many(msgs, f.recipient)
        conn.write(p.InboundResult(f.request_id, receipts))
        for msg, receipt in zip(msgs, receipts, strict=True):
            self.relay.archive(msg, [receipt])

    async def _on_archive_state(self, conn: Conn, f: p.ArchiveState) -> None:
        self.relay.archive_enabled = f.enabled
        self.relay.archive_receipts_ok = f.receipts

    async def _on_remote_receipt(self, conn: Conn, f: p.RemoteReceipt) -> None:
        receipts = [
            (r.sender, Receipt(r.id, r.outcome, r.recipient, r.code, r.message, r.host))
            for r in f.receipts
            if r.sender
        ]
        self.traffic.receipts(r for _, r in receipts)
        self.acks.note(r for _, r in receipts)
        self.dead.note(r for _, r in receipts)
        self.delivery.notify_senders(receipts)

    async def _on_traffic(self, conn: Conn, f: p.Traffic) -> None:
        conn.write(self.traffic.read(f.request_id, f.after, f.limit))

    # --- housekeeping ---------------------------------------------------------------------------

    async def housekeeping(self) -> None:
        last_sweep = 0.0
        while not self._stop.is_set():
            await asyncio.sleep(0.2)
            now = time.monotonic()
            if self.idle_since is not None and now - self.idle_since >= self.settings.idle_exit_s:
                log.info("idle: exiting")
                self._stop.set()
                return
            # Discarded dedup records not carried by a later write: one DELETE per tick at most.
            # A failed one stays pending for the next write; the disk error shows on sends.
            with contextlib.suppress(AuthorityUnavailable):
                self.authority.flush_discarded()
            if now - last_sweep >= self.settings.sweep_interval_s:
                last_sweep = now
                self._sweep()

    def _sweep(self) -> None:
        """Each step on its own, the WALs first: on a full disk the others fail (tried again
        next interval), and the space the WALs hold is what saving mail needs once the disk
        has room again (docs/operations.md, "Runtime dir size"). A failure that is not the
        disk's ends no later sweep either."""
        steps: list[Callable[[], object]] = [
            self.state.checkpoint,
            self.authority.checkpoint,
            self.authority.sweep,
            self.state.forget_old,
            lambda: self.aftercare.expired(self.state.take_expired()),
            lambda: self.aftercare.expired_mail(
                self.inbound.take_expired(self.settings.retention_s)
            ),
            lambda: retire_idle(
                self.state, self.registry, self.aftercare, self.settings.retire_idle_s
            ),
        ]
        for step in steps:
            try:
                step()
            except (sqlite3.Error, AuthorityUnavailable) as exc:  # a full disk, most often
                log.error("housekeeping failed: %s", exc, extra={"error": str(exc)})
            except Exception:
                log.exception("housekeeping step failed")

    def stop(self) -> None:
        self._stop.set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    _methods: dict[type, Method] = {
        p.Register: _on_register,
        p.Send: _on_send,
        p.Reply: _on_reply,
        p.Ack: _on_ack,
        p.Confirm: _on_confirm,
        p.Join: _on_join,
        p.Leave: _on_leave,
        p.SetStatus: _on_set_status,
        p.SetWake: _on_set_wake,
        p.Shown: _on_shown,
        p.Forget: _on_forget,
        p.InboxFault: _on_inbox_fault,
        p.RemoteRoster: _on_remote_roster,
        p.Inbound: _on_inbound,
        p.InboundBatch: _on_inbound_batch,
        p.ForwardResult: _on_forward_result,
        p.RemoteReceipt: _on_remote_receipt,
        p.RosterRefreshed: _on_roster_refreshed,
        p.ArchiveState: _on_archive_state,
        p.Traffic: _on_traffic,
    }


# Outcomes of a send that reached no one: the traffic log keeps them with their code.
_WENT_NOWHERE = frozenset({Outcome.REFUSED, Outcome.NOT_SENT, Outcome.UNKNOWN})
# Outcomes after which an acknowledgement may come.
_ARRIVING = frozenset({Outcome.DELIVERED, Outcome.QUEUED, Outcome.SHOWN})
