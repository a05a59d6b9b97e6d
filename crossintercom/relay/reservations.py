"""The relay's side of path reservations (docs/agents.md#path-reservations): it runs a
session's reserve, release or list against the store, judging other hosts' leases on its own
clock (a reservation of a host whose lease lapsed does not count), and answers the broker."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from crossintercom import protocol as p
from crossintercom.errors import Code, StoreError
from crossintercom.relay.core import RelayCore
from crossintercom.reservations import Held
from crossintercom.storage import LeaseTracker

log = logging.getLogger(__name__)


def wire(held: Sequence[Held]) -> list[p.Reservation]:
    return [
        p.Reservation(
            h.id,
            h.project,
            h.glob,
            h.mode,
            h.host,
            h.session,
            h.created,
            h.expires_at,
            h.name,
            h.reason,
        )
        for h in held
    ]


class Reservations:
    def __init__(
        self,
        relay: RelayCore,
        leases: LeaseTracker,
        publish_roster: Callable[[], Awaitable[None]],
    ) -> None:
        self.relay = relay
        self.leases = leases
        # A reservation counts while its session is on the store's roster: a session that
        # registered just before it reserves is published first (its roster frame came first).
        self.publish_roster = publish_roster

    def lapsed(self) -> set[str]:
        return self.leases.lapsed_hosts() - {self.relay.host}

    async def handle(self, f: p.ReservationRequest) -> None:
        try:
            if f.op != "list":
                await self.publish_roster()
            reply = await self._run(f)
        except StoreError as exc:
            log.warning("reservation %s failed: %s", f.op, exc.message)
            reply = p.ReservationReply(f.fid, code=exc.code, message=exc.message)
        except Exception as exc:  # the session must hear back, not wait for the broker's timeout
            log.exception("reservation %s failed", f.op)
            reply = p.ReservationReply(f.fid, code=Code.INTERNAL, message=f"relay error: {exc}")
        if reply is None:
            self.relay.fenced()
            reply = p.ReservationReply(
                f.fid, code=Code.RELAY_FENCED, message="this host's relay was taken over"
            )
        if self.relay.client is not None:
            self.relay.client.post(reply)

    async def _run(self, f: p.ReservationRequest) -> p.ReservationReply | None:
        r = self.relay
        store, host, gen = r.store, r.host, r.generation
        if f.op == "list":
            found = await store.reservations(f.project, lapsed=self.lapsed())
            return p.ReservationReply(f.fid, wire(found))
        assert f.project is not None
        if f.op == "release":
            released = await store.release(
                host, gen, project=f.project, session_id=f.session, globs=f.globs
            )
            if released is None:
                return None
            found = await store.reservations(f.project, lapsed=self.lapsed())
            mine = [h for h in found if h.session == f.session]
            return p.ReservationReply(f.fid, wire(mine), released=released)
        made = await store.reserve(
            host,
            gen,
            project=f.project,
            session_id=f.session,
            globs=f.globs or [],
            mode=f.mode,
            ttl_s=f.ttl_s,
            reason=f.reason,
            lapsed=self.lapsed(),
        )
        if made is None:
            return None
        if made.conflicts:
            return p.ReservationReply(
                f.fid,
                wire(made.held),
                wire(made.conflicts),
                code=Code.RESERVATION_CONFLICT,
                message=_clash(f.globs or [], made.conflicts),
            )
        return p.ReservationReply(f.fid, wire(made.held))

    async def sweep(self) -> None:
        """The host's own reservations that no longer count go (housekeeping)."""
        await self.relay.store.sweep_reservations(self.relay.host, self.relay.generation)


def _clash(globs: Sequence[str], held: Sequence[Held]) -> str:
    who = "; ".join(
        f"{h.glob} ({h.mode}) held by {h.name or h.session}@{h.host}"
        + (f": {h.reason}" if h.reason else "")
        for h in held
    )
    return f"not reserved ({', '.join(globs)}): clashes with {who}"
