"""The relay: bridges this host's broker to the shared store (docs/architecture.md).

It is a ``control`` client of the local broker and the only component that talks to the
database. ``outbound`` writes what the broker forwards; ``inbound`` hands in what other hosts
sent; this module runs them, keeps the roster and the lease, and stops when fenced. Every
write is fenced by the generation this relay took at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Final, ParamSpec, TypeVar

import msgspec

from crossintercom import protocol as p
from crossintercom.client import AsyncClient, Identity
from crossintercom.config import Settings
from crossintercom.errors import Code, CrossintercomError, StoreError
from crossintercom.machine import machine_identity
from crossintercom.models import SessionInfo, new_id, rightful_claims
from crossintercom.relay.archiver import Archiver
from crossintercom.relay.chores import Chores
from crossintercom.relay.core import RelayCore
from crossintercom.relay.inbound import POLL_BACKSTOP_S, Inbound
from crossintercom.relay.late import LateReceipts
from crossintercom.relay.metrics import package_version
from crossintercom.relay.outbound import Outbound
from crossintercom.relay.reservations import Reservations
from crossintercom.relay.stuck import StuckWatch
from crossintercom.runtime import runtime_dir_too_small
from crossintercom.storage import (
    ArchiveStore,
    Beat,
    HostRow,
    LeaseTracker,
    MailboxStore,
    Wake,
)
from crossintercom.storage.driver import loop_blocked
from crossintercom.storage.interface import Chore
from crossintercom.storage.liveness import effective_lease
from crossintercom.testhooks import stop_at

log = logging.getLogger(__name__)

# Of a frame, the share the remote roster may fill (the rest: its own fields, with room).
ROSTER_SHARE = 0.8

STALL_REPORT_S: Final = 5.0

P = ParamSpec("P")
R = TypeVar("R")


class RelayError(CrossintercomError):
    """The relay cannot run."""

    code = Code.RELAY_ERROR


class RelayInUse(RelayError):
    """Another relay is already running for this host on this machine."""

    code = Code.RELAY_ALREADY_RUNNING


class HostIdCollision(RelayError):
    """Another machine's relay is running with this host id."""

    code = Code.HOST_ID_COLLISION


class Fenced(RelayError):
    """A newer relay took over this host id; this one stops."""

    code = Code.RELAY_FENCED


class Relay(RelayCore):
    def __init__(
        self, settings: Settings, store: MailboxStore, archive: ArchiveStore | None = None
    ) -> None:
        super().__init__(settings, store)
        self.archiver = Archiver(archive, self.host) if archive is not None else None
        self.leases = LeaseTracker(settings.lease_s, heartbeat_s=settings.heartbeat_s)
        self._counting: asyncio.Task[None] | None = None
        self.outbound = Outbound(self)
        self.inbound = Inbound(self, self.outbound)
        self.late_receipts = LateReceipts(self)
        self.stuck = StuckWatch(self)
        self.reservations = Reservations(self, self.leases, self._publish_roster)
        self._published: list[SessionInfo] | None = None
        # The other hosts' roster rows as last read, and the revisions they were read at.
        self._roster: list[SessionInfo] = []
        self._roster_revs: frozenset[tuple[str, int]] | None = None
        self._publish_lock = asyncio.Lock()
        self.failure: BaseException | None = None
        self.machine = machine_identity(settings)

    # --- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        moved = await self._check_collision()
        self.store.observe(self.store_operation)
        self.generation = await self.store.claim_host(self.host, self.machine, package_version())
        log.info("relay started", extra={"host_id": self.host, "generation": self.generation})
        self._expose_state()
        if moved:
            # Read after the claim, which fences the old machine's relay: nothing queued later
            # can have reached it.
            self.inbound.repeat_through = await self.store.queued_through(self.host)
            if self.inbound.repeat_through:
                log.warning(
                    "mail queued for this host id up to seq %d is delivered flagged "
                    "possible_repeat: the machine it moved from may have delivered it already",
                    self.inbound.repeat_through,
                )
        await self._check_trust()
        ident = Identity(id=new_id(), name="relay", purpose="control", status=self.store.url_masked)
        self.client = AsyncClient(self.settings, ident, mode="own", spawn=True, reconnect=True)
        self.client.on_frame = self._on_frame
        await self.client.connect()
        self.report_store(None)
        waiter_thread = threading.Thread(
            target=self.inbound.watch_store, args=(loop,), name="relay-wakeups", daemon=True
        )
        waiter_thread.start()
        # Not a job: it ends once said, and a job that ends stops the relay.
        self.spawn(self._announce_ready())
        jobs = [
            self._heartbeat_loop(),
            self._roster_loop(),
            self.outbound.loop(),
            self.inbound.loop(),
            self.late_receipts.loop(),
            self.record_errors(),
        ]
        if self.archiver is not None:
            jobs.append(self.archiver.loop(self._archive_changed))
        tasks = [loop.create_task(j) for j in jobs]
        stopper = loop.create_task(self.stopping.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception() is not None:
                    self.failure = t.exception()
        finally:
            self.stopping.set()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            stopper.cancel()
            if self._counting is not None:
                self._counting.cancel()
            self.notifier.stopping(f"stopping: host {self.host}")
            await self._say_goodbye()
            await self.client.close()
            waiter_thread.join(POLL_BACKSTOP_S + 1)
        if self.failure is not None:
            raise self.failure

    def _expose_state(self) -> None:
        """What the metrics read of this relay at scrape time (relay/metrics.py)."""
        state = self.metrics.state
        state.host = self.host
        state.backend = self.store.url_masked.split(":", 1)[0]
        state.generation = self.generation
        state.listener_up = self.inbound.listener_up
        state.listener_reconnects = self.inbound.listener_reconnects
        state.broker_up = lambda: self.client is not None and self.client.connected.is_set()
        state.broker_reconnects = lambda: max(0, self.client.connects - 1) if self.client else 0
        state.peers = lambda: {
            h: self.leases.alive(h) for h in self.leases.known() if h != self.host
        }

    async def _announce_ready(self) -> None:
        """READY=1 for systemd once the relay can deliver: the store reached and its schema
        checked (before ``run``), the wake-up channel set up and the broker link up."""
        assert self.client is not None
        await self.inbound.listening.wait()
        await self.client.connected.wait()
        self.notifier.ready(
            f"ready: host {self.host}, generation {self.generation}, store {self.store.url_masked}"
        )
        log.info("relay ready", extra={"host_id": self.host})

    async def _check_trust(self) -> None:
        """Name what undermines the store's trust boundary (docs/operations.md, "Trust model"),
        in the log and on the relay's `status` line for as long as it runs."""
        try:
            found = await self.store.trust_warnings()
        except StoreError as exc:
            log.warning("could not check the store's files: %s", exc.message)
            return
        if (small := runtime_dir_too_small(self.settings.home)) is not None:
            found = [*found, small]
        for warning in found:
            log.warning("%s", warning)
        self.standing_warnings = found

    def stop(self) -> None:
        self.stopping.set()
        self.inbound.wake.set()

    async def _check_collision(self) -> bool:
        """Refuse a host id whose current holder is another machine with a live relay; True
        when the host id moves here from another machine.

        A holder whose heartbeat stays still for ``lease_s`` is gone (a machine replaced,
        a relay frozen or dead): then this machine takes the host id over. A live one means
        two machines are configured with one host id (a cloned VM, a copied env file); taking
        over would make them fence each other in turn, so this relay stops, naming both.
        """
        held = await self.store.host_claim(self.host)
        if held is None or held[0] in (None, self.machine):
            return False
        other, beat = held
        loop = asyncio.get_running_loop()
        deadline = loop.time() + effective_lease(self.settings.lease_s, self.settings.heartbeat_s)
        while loop.time() < deadline:
            await asyncio.sleep(min(0.5, self.settings.heartbeat_s))
            now = await self.store.host_claim(self.host)
            if now is None or now[0] != other:
                return True  # released or taken meanwhile: the claim below sorts it out
            if now[1] != beat:
                raise HostIdCollision(
                    f"host id {self.host!r} is in use by another machine ({other}) whose "
                    f"relay is running; this machine is {self.machine}. Two machines must "
                    "not share a host id (a cloned VM or a copied env file?): give this one "
                    f"its own CROSSINTERCOM_HOST_ID, or delete {self.settings.file('machine.id')} "
                    "if this runtime dir was copied from the other machine"
                )
        log.warning(
            "host id %s moves to this machine (%s) from %s, whose relay stopped",
            self.host,
            self.machine,
            other,
        )
        return True

    async def _say_goodbye(self) -> None:
        """Show our sessions offline at once rather than after the lease lapses."""
        offline = [msgspec.structs.replace(s, online=False) for s in self.local_sessions]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self.store.publish_sessions(self.host, self.generation, offline),
                3.0,
            )

    # --- broker frames --------------------------------------------------------------------------

    def _on_frame(self, frame: p.ToRelayFrame) -> None:
        if isinstance(frame, p.Forward):
            self.outbound.put(frame)
        elif isinstance(frame, p.ArchiveCopy | p.ArchiveReceipts):
            if self.archiver is not None:
                self.archiver.put(frame)
        elif isinstance(frame, p.LocalRoster):
            self.local_sessions = frame.sessions
            if self.archiver is not None:
                self.archiver.know(frame.sessions)
                self._archive_changed(self.archiver.enabled)
            self.spawn(self._publish_roster())
            # Sent on every (re)registration: the broker may be new, so give it the roster.
            self._post_remote_roster()
            self.inbound.poke(Wake(deliveries=True))
        elif isinstance(frame, p.SendReceipts):
            self.late_receipts.put(frame.receipts)
        elif isinstance(frame, p.SessionForgotten):
            self.late_receipts.forget(frame.session)
        elif isinstance(frame, p.ReservationRequest):
            self.spawn(self.reservations.handle(frame))
        else:
            self.spawn(self._refresh_roster(frame.fid))

    async def _refresh_roster(self, fid: int) -> None:
        with contextlib.suppress(StoreError):
            await self._import_roster(force=True)
        assert self.client is not None
        self.client.post(p.RosterRefreshed(fid))

    # --- roster and liveness ----------------------------------------------------------------------

    async def _publish_roster(self) -> None:
        # One publish at a time, each of the latest roster: concurrent ones (a burst of
        # registrations) collided in the store, and an older snapshot could land last.
        async with self._publish_lock:
            sessions = list(self.local_sessions)
            if sessions == self._published:
                return
            try:
                ok = await self.store.publish_sessions(self.host, self.generation, sessions)
            except StoreError as exc:
                log.warning("roster publish failed; will retry", extra={"error": exc.message})
                return
            if not ok:
                self.fenced()
                return
            self._published = sessions

    async def _import_roster(
        self, hosts: Sequence[HostRow] | None = None, *, force: bool = False
    ) -> None:
        """Liveness from ``hosts`` (the heartbeat's answer, else read now); the roster re-read
        only when a host's roster revision moved (or a host came or went)."""
        if hosts is None:
            hosts = await self.store.hosts()
        self.leases.observe(hosts)
        revs = frozenset((h.host_id, h.roster_rev) for h in hosts if h.host_id != self.host)
        if force or revs != self._roster_revs:
            per_host = self.settings.roster_max_per_host
            self._roster, dropped = rightful_claims(await self.store.roster(per_host))
            self._roster_revs = revs
            if dropped:
                log.warning(
                    "roster rows dropped: a durable session id its host and name do not derive, "
                    'or a session id two hosts claim (docs/operations.md, "Trust model")',
                    extra={"sessions": sorted(f"{s.id}@{s.host}" for s in dropped)},
                )
        remote = [
            msgspec.structs.replace(s, online=s.online and self.leases.alive(s.host))
            for s in self._roster
            if s.host != self.host and s.purpose == "agent"
        ]
        if force or remote != self.remote_sessions:
            self.remote_sessions = remote
            self._post_remote_roster()

    def _archive_changed(self, enabled: bool) -> None:
        if self.client is not None:
            self.client.post(p.ArchiveState(enabled, receipts=True))

    def _post_remote_roster(self) -> None:
        if self.archiver is not None:
            self.archiver.know(self.remote_sessions)
        if self.client is not None:
            self.client.post(p.RemoteRoster(self._framed_roster()))

    def _framed_roster(self) -> list[SessionInfo]:
        """The remote sessions that fit one frame (ROSTER_SHARE of it): many hosts at their
        bound could publish more than the broker's link carries, and a frame over the limit
        drops the link. Those past it are left out, and logged."""
        budget, used = int(self.settings.max_frame_bytes * ROSTER_SHARE), 0
        for i, s in enumerate(self.remote_sessions):
            used += len(msgspec.json.encode(s)) + 1
            if used > budget:
                log.warning(
                    "remote roster cut to %d of %d sessions: more than one frame carries",
                    i,
                    len(self.remote_sessions),
                )
                return self.remote_sessions[:i]
        return self.remote_sessions

    def fenced(self) -> None:
        self.failure = Fenced(
            f"another relay took over host id {self.host!r} (generation {self.generation} is "
            "stale); this relay stops"
        )
        self.stop()

    async def _watched_heartbeat(self, chores: Sequence[Chore] = ()) -> Beat | None:
        """The heartbeat, reported in `status` while it hangs: a writer stuck holding the SQLite
        file's lock (or a database that stopped answering) shows within STALL_REPORT_S rather
        than only after every busy timeout and retry has run out."""
        local_ids = [s.id for s in self.local_sessions]

        async def consume_then_beat() -> Beat | None:
            # Handled receipts go first, so the beat's probe sees only receipts not handled.
            await self.inbound.receipts.consume()
            return await self.store.beat(self.host, self.generation, local_ids, chores)

        beat = asyncio.ensure_future(consume_then_beat())
        due = asyncio.get_running_loop().time() + STALL_REPORT_S
        done, _ = await asyncio.wait({beat}, timeout=STALL_REPORT_S)
        blocked = None if done else loop_blocked(due)
        if blocked is not None:
            # The wait's own timer ran late: this relay's loop was busy, not the store.
            log.warning(
                "this relay's event loop was blocked for over %.1f s (work on the loop, not "
                "the store); the heartbeat waited behind it",
                blocked,
            )
        elif not done:
            why = (
                f"WARNING the store has not answered for over {STALL_REPORT_S:.0f} s (another "
                "process holding the SQLite file's write lock, or a database outage)"
            )
            named = None
            with contextlib.suppress(TimeoutError):
                # Whose transaction it waits behind, where the store can say (PostgreSQL);
                # the check logs a session it names itself.
                named = await asyncio.wait_for(self.stuck.check(1.0), STALL_REPORT_S)
            if named is None:
                log.warning("%s", why)
            self.report_store(named or why)
        return await beat

    async def _roster_loop(self) -> None:
        """Import the rosters when a roster hint says one changed (the heartbeat's revisions
        catch a lost hint): one hosts read, and the roster read only if a revision moved."""
        while not self.stopping.is_set():
            await self.roster_hinted.wait()
            self.roster_hinted.clear()
            try:
                await self._import_roster()
            except StoreError as exc:
                log.warning("roster import failed: %s", exc.message)

    def _count_broker_mail(self) -> None:
        """Held mail and dead letters for the metrics, asked of the broker (which keeps them,
        not the store) on a task of its own: a broker that does not answer (frozen, busy) must
        never hold the heartbeat up. One request at a time."""
        client = self.client
        if client is None or not client.connected.is_set():
            return
        if self._counting is not None and not self._counting.done():
            return

        async def count() -> None:
            try:
                self.metrics.broker_counts(await client.counts())
            except CrossintercomError as exc:
                log.debug("broker counts for the metrics: %s", exc.message)

        self._counting = asyncio.get_running_loop().create_task(count())

    async def _heartbeat_loop(self) -> None:
        # One transaction per heartbeat_s when idle: the heartbeat, whose answer carries the
        # leases, the roster revisions and the poll backstop's probe, with the periodic chores
        # in it when they are due (docs/storage.md, "Idle load").
        chores = Chores(self, self.stuck, self._watched_heartbeat)
        while not self.stopping.is_set():
            try:
                count = self.metrics.serving  # the metrics' store counts ride every beat
                beat = await chores.beat(count=count)
                if beat is None:
                    self.fenced()
                    return
                self.metrics.state.beat_at = time.monotonic()
                if count:
                    self._count_broker_mail()
                self.report_store(self.stuck.warning)
                if self._published is None or self.local_sessions != self._published:
                    await self._publish_roster()
                await self._import_roster(beat.hosts)
                self.inbound.backstop(beat)
                on = beat.archive_enabled
                if self.archiver is not None and on is not None and self.archiver.settle(on):
                    self._archive_changed(self.archiver.enabled)
            except StoreError as exc:
                log.warning("store unreachable; retrying: %s", exc.message)
                self.report_store(f"WARNING {exc.message}")
            await asyncio.sleep(self.settings.heartbeat_s)
            # The fault tests block the loop here (testhooks.py) to see the watchdog's pings stop.
            stop_at("relay_heartbeat")
