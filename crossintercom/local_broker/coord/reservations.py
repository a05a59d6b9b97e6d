"""The broker's side of path reservations (docs/agents.md#path-reservations): a session's
reserve, unreserve or list goes to this host's relay, which runs it against the shared store
(the authority), and the answer comes back to the session. Without a relay there is no answer
to give: the session is told ``relay_not_running`` and how to start one."""

from __future__ import annotations

import asyncio
import itertools
from typing import Final

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import Code, ProtocolError
from crossintercom.local_broker.delivery.ratelimit import RateLimiter
from crossintercom.local_broker.delivery.relay_link import RelayLink
from crossintercom.local_broker.sessions.conn import Conn
from crossintercom.reservations import BadGlob, normalise
from crossintercom.safetext import is_one_line

# Past the store's own deadlines: a relay that has not answered by then counts as lost.
ANSWER_WAIT_S: Final = 60.0
NO_RELAY: Final = (
    "path reservations live in the shared store and this host's relay is not running; start it "
    "(`crossintercom relay`, or its service: docs/operations.md) and try again"
)


class ReservationDesk:
    def __init__(self, relay: RelayLink, settings: Settings) -> None:
        self.relay = relay
        self._ids = itertools.count(1)
        # Reserve, unreserve and inbound policy changes per session: each costs other hosts a
        # store transaction (docs/agents.md#policy), so a flood stops here.
        self.limiter = RateLimiter(settings.coord_rate_count, settings.coord_rate_window_s)
        self._waiting: dict[int, asyncio.Future[p.ReservationReply]] = {}
        relay.on_detach.append(self._relay_gone)

    def admit(self, session: str) -> None:
        """Count one coordination request of ``session``; refused past its rate."""
        if not self.limiter.admit(session, str(next(self._ids))):
            raise ProtocolError(
                f"this session made more than {self.limiter.count} coordination requests "
                f"(reserve, unreserve, inbound policy changes) in {self.limiter.window_s:g} s; "
                "nothing was changed, try again later",
                code=Code.COORD_RATE_LIMITED,
            )

    def request(
        self, session: str, f: p.Reserve | p.Unreserve | p.Reservations
    ) -> p.ReservationRequest:
        """The relay's frame for a session's one, checked and with its globs normalised."""
        fid = next(self._ids)
        if isinstance(f, p.Reservations):
            return p.ReservationRequest(fid, "list", session, f.project)
        self.admit(session)
        if not is_one_line(f.project):
            raise ProtocolError("a project key is one line", code=Code.NOT_ONE_LINE)
        try:
            globs = None if f.globs is None else [normalise(g) for g in f.globs]
        except BadGlob as exc:
            raise ProtocolError(str(exc), code=Code.INVALID_ARGUMENT) from None
        if isinstance(f, p.Unreserve):
            return p.ReservationRequest(fid, "release", session, f.project, globs)
        if f.reason is not None and not is_one_line(f.reason):
            raise ProtocolError("a reservation's reason is one line", code=Code.NOT_ONE_LINE)
        return p.ReservationRequest(
            fid, "reserve", session, f.project, globs, f.mode, f.ttl_s, f.reason
        )

    async def ask(self, frame: p.ReservationRequest) -> p.ReservationReply:
        relay = self.relay.conn
        if relay is None:
            raise ProtocolError(NO_RELAY, code=Code.RELAY_NOT_RUNNING)
        fut: asyncio.Future[p.ReservationReply] = asyncio.get_running_loop().create_future()
        self._waiting[frame.fid] = fut
        try:
            if not relay.write(frame):
                raise ProtocolError(NO_RELAY, code=Code.RELAY_NOT_RUNNING)
            return await asyncio.wait_for(fut, ANSWER_WAIT_S)
        except (TimeoutError, ConnectionError):
            raise ProtocolError(
                "the relay stopped answering before the store did; see `crossintercom status`",
                code=Code.RELAY_LOST,
            ) from None
        finally:
            self._waiting.pop(frame.fid, None)

    async def answer(self, conn: Conn, request_id: int, frame: p.ReservationRequest) -> None:
        """Ask the relay and answer the session (run as a task: the store may take a while)."""
        try:
            r = await self.ask(frame)
        except ProtocolError as exc:
            conn.write(p.Error(exc.code, exc.message, request_id))
            return
        if r.code is not None and r.code != Code.RESERVATION_CONFLICT:
            conn.write(p.Error(r.code, r.message or r.code, request_id))
            return
        answer = p.ReservationList(
            request_id, r.items, r.conflicts, r.released, r.code, r.message, r.more
        )
        conn.write(answer)

    def answered(self, f: p.ReservationReply) -> None:
        fut = self._waiting.get(f.fid)
        if fut is not None and not fut.done():
            fut.set_result(f)

    def _relay_gone(self) -> None:
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError("relay disconnected"))
