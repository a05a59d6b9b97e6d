"""The broker's side of its relay: forwards out, roster both ways, inbound mail in.

The relay is a ``control`` connection. Two kinds of request wait on it, each in its own table:
forwards (answered by ``forward_result`` with one receipt per recipient) and roster refreshes
(answered by ``roster_refreshed``). When the relay goes, both fail at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import Final

import msgspec

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import Code, ProtocolError
from crossintercom.local_broker.delivery.resolve import Target
from crossintercom.local_broker.delivery.traffic import Traffic
from crossintercom.local_broker.sessions.conn import Conn
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.models import Message, Outcome, Receipt

ROSTER_REFRESH_WAIT_S: Final = 2.0
# How long past the store's own wait a forward may take before the relay counts as lost.
_FORWARD_GRACE_S: Final = 10.0
_SWEEP_S: Final = 1.0
# A message that went nowhere (refused, not sent) is not history.
_ARCHIVED_OUTCOMES: Final = frozenset({Outcome.DELIVERED, Outcome.QUEUED, Outcome.UNKNOWN})


class RelayLink:
    def __init__(self, settings: Settings, registry: Registry) -> None:
        self.settings = settings
        self.registry = registry
        self.conn: Conn | None = None
        self.store_status: str | None = None
        # Told by the relay (``archive_state``); copies go out only while it is on.
        self.archive_enabled = False
        # The relay takes ``archive_receipts`` (``archive_state.receipts``).
        self.archive_receipts_ok = False
        self._ids = itertools.count(1)
        self._forwards: dict[int, asyncio.Future[list[Receipt]]] = {}
        # fid -> when its forward counts as lost, in fid order (each deadline the same span
        # after its forward); swept by one timer while any is open.
        self._deadlines: dict[int, float] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._refreshes: dict[int, asyncio.Future[None]] = {}
        # Every message this host handles passes ``archive``: the overseer's log sees it there.
        self.traffic: Traffic | None = None
        # Called when the relay goes: other rooms' requests waiting on it fail then.
        self.on_detach: list[Callable[[], None]] = []

    @property
    def connected(self) -> bool:
        return self.conn is not None

    def attach(self, conn: Conn, store_status: str | None) -> None:
        if self.conn is not None:
            raise ProtocolError(
                "a relay is already connected to this broker", code=Code.RELAY_ALREADY_CONNECTED
            )
        conn.control = conn.owner = True
        self.conn = conn
        self.store_status = store_status
        self.send_local_roster()
        for raw in self.registry.state.outbox_take():
            frame = _kept.decode(raw)
            if isinstance(frame, p.SessionForgotten) and self.registry.is_local(frame.session):
                continue  # the name was used again since: its new mail must not expire
            conn.write(frame)

    def detach(self, conn: Conn) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        self.store_status = None
        self.archive_enabled = False
        self.registry.remote.clear()
        for forward in self._forwards.values():
            if not forward.done():
                forward.set_exception(ConnectionError("relay disconnected"))
        for refresh in self._refreshes.values():
            if not refresh.done():
                refresh.set_exception(ConnectionError("relay disconnected"))
        for detached in self.on_detach:
            detached()

    def require(self, conn: Conn) -> None:
        if conn is not self.conn:
            raise ProtocolError("only the relay may send this frame", code=Code.NOT_RELAY)

    # --- out --------------------------------------------------------------------------------

    async def forward(self, msg: Message, targets: list[Target]) -> list[Receipt]:
        relay = self.conn
        if relay is None:
            return [
                Receipt(
                    msg.id,
                    Outcome.NOT_SENT,
                    t.session_id,
                    Code.NO_RELAY,
                    "no relay is connected on this host; nothing was sent",
                )
                for t in targets
            ]
        fid = next(self._ids)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Receipt]] = loop.create_future()
        self._forwards[fid] = fut
        self._deadlines[fid] = loop.time() + self.settings.remote_ack_wait_s + _FORWARD_GRACE_S
        if self._sweep is None:
            self._sweep = loop.call_later(_SWEEP_S, self._expire)
        recipients = [p.Recipient(t.session_id, t.host) for t in targets]
        relay.write(p.Forward(fid, msg, recipients))
        try:
            return await fut
        except (TimeoutError, ConnectionError):
            return [
                Receipt(
                    msg.id,
                    Outcome.UNKNOWN,
                    t.session_id,
                    Code.RELAY_LOST,
                    "the relay stopped answering; do not resend automatically",
                )
                for t in targets
            ]
        finally:
            self._forwards.pop(fid, None)
            self._deadlines.pop(fid, None)

    def _expire(self) -> None:
        """Fail the forwards the relay has not answered by their deadline. One sweep a second
        for all of them, not a timer per forward: at a thousand forwards a second those timers
        were a sixth of the broker's CPU (docs/perf-log/2026-12.md, "Cross-host throughput: the
        cycle")."""
        now = asyncio.get_running_loop().time()
        for fid, deadline in self._deadlines.items():
            if deadline > now:
                break  # in order of fid, so of deadline
            fut = self._forwards.get(fid)
            if fut is not None and not fut.done():
                fut.set_exception(TimeoutError())
        self._sweep = None
        if self._deadlines:
            self._sweep = asyncio.get_running_loop().call_later(_SWEEP_S, self._expire)

    def forward_result(self, f: p.ForwardResult) -> None:
        fut = self._forwards.get(f.fid)
        if fut is not None and not fut.done():
            fut.set_result(f.receipts)

    async def refresh_roster(self) -> None:
        """Ask the relay to re-read the roster now; give up quietly after a short wait."""
        if self.conn is None:
            return
        fid = next(self._ids)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._refreshes[fid] = fut
        self.conn.write(p.RefreshRoster(fid))
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(fut, ROSTER_REFRESH_WAIT_S)
        self._refreshes.pop(fid, None)

    def roster_refreshed(self, f: p.RosterRefreshed) -> None:
        fut = self._refreshes.get(f.fid)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def archive(self, msg: Message, receipts: list[Receipt]) -> None:
        """Hand the relay a copy for the archive: a buffered write, never awaited, so neither a
        slow relay nor a slow archive reaches the sender (docs/archive.md)."""
        wait_s = self.traffic.message(msg, receipts) if self.traffic is not None else None
        if self.conn is None or not self.archive_enabled:
            return
        if any(r.outcome in _ARCHIVED_OUTCOMES for r in receipts):
            self.conn.write(p.ArchiveCopy(msg, receipts, wait_s))

    def archive_receipts(self, receipts: list[Receipt]) -> None:
        """Later outcomes of mail delivered here (``shown``, …) for the archive, so pages on
        other hosts see them too (docs/archive.md); a buffered write, never awaited."""
        if self.conn is None or not (self.archive_enabled and self.archive_receipts_ok):
            return
        out = [
            p.ArchiveReceipt(r.id, r.recipient, r.outcome.value, r.code)
            for r in receipts
            if r.recipient is not None
        ]
        if out:
            self.conn.write(p.ArchiveReceipts(out))

    def send_local_roster(self) -> None:
        if self.conn is not None:
            self.conn.write(p.LocalRoster(self.registry.local_sessions()))

    def _post_or_keep(self, frame: p.ToRelayFrame) -> None:
        """A frame for the relay that must not be lost while none is connected: kept in
        ``broker.sqlite`` (for the retention) and handed to the next relay that attaches."""
        if self.conn is None or not self.conn.write(frame):
            encoded = msgspec.json.encode(frame).decode()
            self.registry.state.outbox_put(encoded, self.settings.retention_s)

    def send_receipts(self, receipts: list[p.ReceiptFor]) -> None:
        """Receipts for senders on other hosts, written to the store by the relay."""
        if receipts:
            self._post_or_keep(p.SendReceipts(receipts))

    def forgotten(self, session_id: str) -> None:
        self._post_or_keep(p.SessionForgotten(session_id))


_kept: msgspec.json.Decoder[p.ToRelayFrame] = msgspec.json.Decoder(p.ToRelayFrame)
