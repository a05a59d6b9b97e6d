"""The fault kinds of `crossintercom chaos`, which a run injects, and injecting each.

Faults come in seeded rounds: each round is every kind of the run once, in a shuffled order,
so a run long enough for one round has hit every kind. A kind that does not apply at its turn
(the chosen host's relay is still down from an earlier fault) keeps its turn for the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from crossintercom.client import AsyncClient
from crossintercom.models import new_id
from crossintercom.tools.chaos import coordflood, disk, failover
from crossintercom.tools.chaos.rogue import HOSTILE_KINDS, hostile_payload, inject_rows
from crossintercom.tools.chaos.state import GATEWAY_HOST, ChaosState
from crossintercom.tools.chaos.takeover import resume, take_over
from crossintercom.tools.common import Store

FAULT_KINDS = (
    "relay_kill",
    "relay_pause",
    "broker_kill",
    "listener_kill",
    "pg_terminate",
    "pg_blackhole",
    "pg_cut",
    "pg_restart",
    "pg_failover",
    "hostile_rows",
    "relay_takeover",
    "coord_flood",
    "gateway_kill",
    *disk.DISK_KINDS,
)
PG_ONLY = frozenset({"pg_terminate", "pg_blackhole", "pg_cut", "pg_restart", "pg_failover"})
# Only against a server the run started itself.
OWN_SERVER_ONLY = frozenset({"pg_restart", "pg_failover"})
# The injector's pace: a fault every this many seconds (uniform), each undone after that long.
EVERY_S = (0.5, 2.5)
UNDO_AFTER_S = (0.2, 2.0)
HOLD_S = (1.0, 3.0)  # store traffic held, a disk full or an inbox read-only


def fault_kinds(
    backend: str,
    wanted: list[str] | None = None,
    *,
    own_server: bool = False,
    unavailable: Mapping[str, str] | None = None,
) -> list[str]:
    """The fault kinds a run on ``backend`` injects: ``wanted`` (default all) less those that do
    not apply to it, and less those this machine cannot inject (``unavailable``: kind -> why)."""
    kinds = wanted or list(FAULT_KINDS)
    unknown = set(kinds) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    return [
        k
        for k in kinds
        if (backend == "postgres" or k not in PG_ONLY)
        and (own_server or k not in OWN_SERVER_ONLY)
        and k not in (unavailable or {})
    ]


def _pg_terminate(store: Store) -> int:
    import psycopg

    with psycopg.connect(store.parsed.libpq_conninfo(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        ).fetchall()
    return sum(1 for r in rows if r[0])


# A fault returns what its log entry adds, or None when it does not apply now.
Fault = Callable[[int], Any]


class Injector:
    def __init__(self, state: ChaosState, immutable: disk.Immutable) -> None:
        self.state = state
        self.immutable = immutable
        self.rng = random.Random(state.setup.seed)
        self._turns: deque[str] = deque()
        self.faults: dict[str, Fault] = {
            "relay_kill": self.relay_kill,
            "relay_pause": self.relay_pause,
            "broker_kill": self.broker_kill,
            "listener_kill": self.listener_kill,
            "pg_terminate": self.pg_terminate,
            "pg_blackhole": self.pg_blackhole,
            "pg_cut": self.pg_cut,
            "pg_restart": self.pg_restart,
            "pg_failover": self.pg_failover,
            "hostile_rows": self.hostile_rows,
            "relay_takeover": self.relay_takeover,
            "coord_flood": self.coord_flood,
            "gateway_kill": self.gateway_kill,
            "inbox_readonly": self.inbox_readonly,
            "disk_full": self.disk_full,
        }

    def _next_kind(self) -> str:
        if not self._turns:
            order = list(self.state.setup.kinds)
            self.rng.shuffle(order)
            self._turns.extend(order)
        return self._turns.popleft()

    async def loop(self, stop: asyncio.Event) -> None:
        state = self.state
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(*EVERY_S))
            if stop.is_set():
                return
            kind = self._next_kind()
            i = self.rng.randrange(len(state.hosts))
            host_id, t = state.hosts[i].host_id, state.now()
            detail = await self.faults[kind](i)
            if detail is None:
                self._turns.appendleft(kind)  # its turn again at the next tick
                continue
            state.faults[kind] += 1
            # When it began: a takeover takes seconds, and what is sent meanwhile is its own.
            entry: dict[str, Any] = {"t": t, "fault": kind, "host": host_id}
            state.fault_log.append(entry | detail)

    def _undo_after(self, i: int, fn: Callable[[], object], span: tuple[float, float]) -> float:
        delay = self.rng.uniform(*span)
        self.state.later(delay, i, fn)
        return round(delay, 2)

    def _relay_up(self, i: int) -> subprocess.Popen[bytes] | None:
        proc = self.state.hosts[i].relay
        return proc if proc is not None and proc.poll() is None else None

    # -- processes ------------------------------------------------------------------------

    async def relay_kill(self, i: int) -> dict[str, Any] | None:
        host = self.state.hosts[i]
        if self._relay_up(i) is None:
            return None  # still down from an earlier fault
        await asyncio.to_thread(host.kill_relay)
        restart = functools.partial(host.start_relay, wait=False)
        return {"restart_after_s": self._undo_after(i, restart, UNDO_AFTER_S)}

    async def relay_pause(self, i: int) -> dict[str, Any] | None:
        proc = self._relay_up(i)
        if proc is None:
            return None
        proc.send_signal(signal.SIGSTOP)
        return {
            "restart_after_s": self._undo_after(i, functools.partial(resume, proc), UNDO_AFTER_S)
        }

    async def broker_kill(self, i: int) -> dict[str, Any] | None:
        return {} if self.state.hosts[i].kill_broker() else None

    async def listener_kill(self, i: int) -> dict[str, Any] | None:
        listener = self.state.listeners[i]
        if not listener.alive():
            return None
        await asyncio.to_thread(listener.kill)
        return {"restart_after_s": self._undo_after(i, listener.restart, UNDO_AFTER_S)}

    async def relay_takeover(self, i: int) -> dict[str, Any] | None:
        state = self.state
        if state.pending[i] or self._relay_up(i) is None:
            return None  # the takeover needs a running relay with nothing else to undo
        if state.gateway is not None and i == GATEWAY_HOST:
            return None  # the gateway lends this machine's broker: the host stays on it
        state.pending[i] += 1
        try:
            moved = await asyncio.to_thread(take_over, state, i)
            if moved is None:
                return None
            client = AsyncClient(moved.machine.settings, moved.machine.identity("src", cwd="/"))
            await client.connect()
        finally:
            state.pending[i] -= 1
        state.machines[moved.machine.host_id].append(moved.machine)
        # The old machine's sender may still be waiting on a send: it is closed at the end.
        state.retired_clients.append(state.clients[i])
        state.hosts[i], state.listeners[i], state.clients[i] = (
            moved.machine,
            moved.listener,
            client,
        )
        return moved.entry

    # -- the store --------------------------------------------------------------------------

    async def pg_terminate(self, i: int) -> dict[str, Any] | None:
        return {"terminated": await asyncio.to_thread(_pg_terminate, self.state.store)}

    async def pg_blackhole(self, i: int) -> dict[str, Any] | None:
        proxy = self.state.setup.proxy
        assert proxy is not None
        proxy.blackhole()
        # every relay's store connections go through the proxy
        return {"host": "all", "restart_after_s": self._undo_after(i, proxy.resume, HOLD_S)}

    async def pg_cut(self, i: int) -> dict[str, Any] | None:
        proxy = self.state.setup.proxy
        assert proxy is not None
        return {"host": "all", "terminated": proxy.cut()}

    async def pg_restart(self, i: int) -> dict[str, Any] | None:
        replica = self.state.setup.replica
        server = replica.primary if replica is not None else self.state.setup.server
        assert server is not None
        started = time.monotonic()
        await asyncio.to_thread(server.restart)
        return {"host": "all", "restart_took_s": round(time.monotonic() - started, 2)}

    async def pg_failover(self, i: int) -> dict[str, Any] | None:
        replica = self.state.setup.replica
        assert replica is not None
        entry = await asyncio.to_thread(failover.fail_over, self.state, replica)
        if entry is not None:
            rejoin = functools.partial(failover.rejoin, self.state, replica, entry["failover"])
            entry["rejoin_after_s"] = self._undo_after(i, rejoin, failover.REJOIN_AFTER_S)
        return entry

    async def hostile_rows(self, i: int) -> dict[str, Any] | None:
        state = self.state
        victim, claimed = state.hosts[i], state.hosts[(i + 1) % len(state.hosts)]
        rows = []
        for kind in HOSTILE_KINDS:
            mid = new_id()
            payload = hostile_payload(
                kind, mid, rogue_host=state.rogue_host, claimed_host=claimed.host_id
            )
            rows.append((mid, payload))
            state.injected[mid] = kind
        await asyncio.to_thread(
            inject_rows,
            state.store.url,
            rows,
            sender_host=state.rogue_host,
            recipient_host=victim.host_id,
            recipient_session=victim.session_id("sink"),
        )
        return {"injected": len(rows)}

    async def coord_flood(self, i: int) -> dict[str, Any] | None:
        return await coordflood.flood(self.state.hosts[i])

    async def gateway_kill(self, i: int) -> dict[str, Any] | None:
        gateway = self.state.gateway
        if gateway is None or not gateway.alive():
            return None  # still down from the last one
        await asyncio.to_thread(gateway.kill)
        after = self._undo_after(GATEWAY_HOST, gateway.restart, UNDO_AFTER_S)
        return {"host": self.state.hosts[GATEWAY_HOST].host_id, "restart_after_s": after}

    # -- the recipient's disk --------------------------------------------------------------------

    async def inbox_readonly(self, i: int) -> dict[str, Any] | None:
        if self.state.pending[i]:
            return None
        files = disk.sink_inbox_files(self.state.hosts[i])
        if not files or not await asyncio.to_thread(self.immutable.make, files):
            return None
        release = functools.partial(self.immutable.release, files)
        return {"files": len(files), "released_after_s": self._undo_after(i, release, HOLD_S)}

    async def disk_full(self, i: int) -> dict[str, Any] | None:
        if self.state.pending[i]:
            return None
        home = self.state.hosts[i].home
        filler = await asyncio.to_thread(disk.fill, home)
        return {"freed_after_s": self._undo_after(i, filler.unlink, HOLD_S)}
