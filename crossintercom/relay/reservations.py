"""The relay's side of path reservations (docs/agents.md#path-reservations): it runs a
session's reserve, release or list against the store, judging other hosts' leases on its own
clock (a reservation of a host whose lease lapsed does not count), and answers the broker.

Every answer fits one frame whatever the store holds (docs/protocol.md): the
store reads bounded rows, and a list past the frame's share is cut here and marked ``more``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from crossintercom import protocol as p
from crossintercom.config import Settings
from crossintercom.errors import Code, StoreError
from crossintercom.relay.core import RelayCore
from crossintercom.reservations import Held, Quotas
from crossintercom.storage import LeaseTracker

log = logging.getLogger(__name__)

# Of a reply's frame, the share each of its two lists may fill; the rest is its message and
# the frame's own fields (a message names at most CLASH_NAMED reservations).
LIST_SHARE = 0.4
CLASH_NAMED = 5


def wire(held: Sequence[Held], budget: int | None = None) -> tuple[list[p.Reservation], bool]:
    """``held`` as the wire carries it, as many as fit in ``budget`` bytes of JSON (None: all),
    and whether some were left out."""
    out: list[p.Reservation] = []
    used = 0
    for h in held:
        r = p.Reservation(
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
        if budget is not None:
            used += len(msgspec.json.encode(r)) + 1
            if used > budget:
                return out, True
        out.append(r)
    return out, False


def quotas(settings: Settings) -> Quotas:
    return Quotas(
        per_session=settings.reservation_max_per_session,
        per_session_chars=settings.reservation_max_chars_per_session,
        per_host=settings.reservation_max_per_host,
        per_host_chars=settings.reservation_max_chars_per_host,
    )


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
        self.quotas = quotas(relay.settings)
        self.budget = int(relay.settings.max_frame_bytes * LIST_SHARE)

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

    async def _listed(self, project: str | None) -> tuple[list[Held], bool]:
        return await self.relay.store.reservation_page(
            project, lapsed=self.lapsed(), per_host=self.quotas.per_host
        )

    async def _run(self, f: p.ReservationRequest) -> p.ReservationReply | None:
        r = self.relay
        store, host, gen = r.store, r.host, r.generation
        if f.op == "list":
            found, more = await self._listed(f.project)
            items, cut = wire(found, self.budget)
            return p.ReservationReply(f.fid, items, more=more or cut)
        assert f.project is not None
        if f.op == "release":
            released = await store.release(
                host, gen, project=f.project, session_id=f.session, globs=f.globs
            )
            if released is None:
                return None
            found, more = await self._listed(f.project)
            items, cut = wire([h for h in found if h.session == f.session], self.budget)
            return p.ReservationReply(f.fid, items, released=released, more=more or cut)
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
            quotas=self.quotas,
        )
        if made is None:
            return None
        items, cut = wire(made.held, self.budget)
        if made.conflicts:
            clash, cut_clash = wire(made.conflicts, self.budget)
            return p.ReservationReply(
                f.fid,
                items,
                clash,
                code=Code.RESERVATION_CONFLICT,
                message=_clash(f.globs or [], made.conflicts),
                more=cut or cut_clash,
            )
        return p.ReservationReply(f.fid, items, more=cut)

    async def sweep(self) -> None:
        """The host's own reservations that no longer count go (housekeeping)."""
        await self.relay.store.sweep_reservations(self.relay.host, self.relay.generation)


def _clash(globs: Sequence[str], held: Sequence[Held]) -> str:
    who = "; ".join(
        f"{h.glob} ({h.mode}) held by {h.name or h.session}@{h.host}"
        + (f": {h.reason}" if h.reason else "")
        for h in held[:CLASH_NAMED]
    )
    rest = len(held) - CLASH_NAMED
    more = f"; and {rest} more" if rest > 0 else ""
    asked = ", ".join(globs[:CLASH_NAMED]) + (", ..." if len(globs) > CLASH_NAMED else "")
    return f"not reserved ({asked}): clashes with {who}{more}"
