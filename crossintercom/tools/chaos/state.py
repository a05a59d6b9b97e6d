"""What the parts of a chaos run share: the hosts, the messages sent and the faults injected.

A host id runs on one machine at a time (``hosts[i]``), but a takeover moves it to another
(``relay_takeover``): every machine it ran on stays in ``machines`` until the end, since the mail
it saved there counts, and its listener keeps running so that what it holds is read.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tenacity

from crossintercom.client import AsyncClient
from crossintercom.errors import InboxUnavailable
from crossintercom.tools.chaos.gateway import ChaosGateway
from crossintercom.tools.common import Store
from crossintercom.tools.harness import Cluster, ListenerProcess, SimHost
from crossintercom.tools.pgcluster import ThrowawayPostgres
from crossintercom.tools.pgreplica import ReplicatedPostgres
from crossintercom.tools.proxy import TcpProxy

SINK = "sink"
# The host whose broker a gateway lends (gateway_kill); a takeover leaves it alone.
GATEWAY_HOST = 0
ACKNOWLEDGED = ("delivered", "queued")


@dataclass
class Sent:
    seq: int
    id: str
    sender_host: str
    recipient_host: str
    outcome: str
    code: str | None = None
    t: float = 0.0  # when it was sent, from the start of traffic
    via_gateway: bool = False  # sent by the remote session, through the gateway


# An inbox its listener is still recovering (a journal a killed listener left, which only its
# restarted writer can roll back; a disk fault being undone) is read again until it can be.
@tenacity.retry(
    retry=tenacity.retry_if_exception_type(InboxUnavailable),
    wait=tenacity.wait_fixed(0.2),
    stop=tenacity.stop_after_delay(20),
    reraise=True,
)
def read_sink(host: SimHost) -> list[tuple[str, str]]:
    """(message id, text) of every message saved in the sink's inbox on ``host``."""
    with host.open_inbox(SINK) as inbox:
        return [(e.id, str(e.body.get("message", ""))) for e in inbox.messages()]


@dataclass
class RunSetup:
    """What the run was given: the store, its fault kinds and the machinery some need."""

    store: Store
    kinds: list[str]
    seed: int
    token: str
    cluster: Cluster[SimHost]
    # A host's config.json (also for the machine a takeover brings in).
    host_config: dict[str, float]
    proxy: TcpProxy | None = None
    server: ThrowawayPostgres | None = None
    # The run's own primary + standby (``pg_failover``), instead of ``server``.
    replica: ReplicatedPostgres | None = None
    # Readies a machine's runtime dir before its relay starts (mounts its tmpfs, for
    # ``disk_full``), for a machine a takeover brings in too.
    prepare_home: Callable[[SimHost], None] | None = None


class ChaosState:
    def __init__(self, setup: RunSetup, hosts: list[SimHost]) -> None:
        self.setup = setup
        self.store = setup.store
        self.token = setup.token
        self.hosts = hosts  # the machine each host id runs on now
        self.machines: dict[str, list[SimHost]] = {h.host_id: [h] for h in hosts}
        self.listeners: list[ListenerProcess] = []  # the sink's on each current machine
        self.clients: list[AsyncClient] = []  # the sender's on each current machine
        self.retired_clients: list[AsyncClient] = []  # on machines a takeover left
        # gateway_kill: host GATEWAY_HOST's gateway and the remote session sending through it.
        self.gateway: ChaosGateway | None = None
        self.remote: AsyncClient | None = None
        self.sent: list[Sent] = []
        self.faults: Counter[str] = Counter()
        self.fault_log: list[dict[str, Any]] = []
        self.injected: dict[str, str] = {}  # hostile row id -> its kind
        self.rogue_host = f"rogue-{setup.token}"
        # Hosts with a fault still to be undone (a restart, a resume, a release): the faults
        # that need a host in its normal state leave them alone meanwhile.
        self.pending: Counter[int] = Counter()
        self._undo: set[asyncio.Task[None]] = set()
        self.t0 = 0.0

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def later(self, delay: float, host: int, fn: Callable[[], object]) -> None:
        """Run the blocking ``fn`` ``delay`` seconds from now; ``host`` is pending until then."""
        self.pending[host] += 1

        async def run() -> None:
            try:
                await asyncio.sleep(delay)
                await asyncio.to_thread(fn)
            finally:
                self.pending[host] -= 1

        task = asyncio.get_running_loop().create_task(run())
        self._undo.add(task)
        task.add_done_callback(self._undo.discard)

    async def undo_all(self) -> None:
        """Wait for every pending restart, resume and release."""
        if self._undo:
            await asyncio.gather(*self._undo, return_exceptions=True)

    def every_machine(self) -> list[SimHost]:
        return [m for ms in self.machines.values() for m in ms]

    def inboxes(self) -> dict[str, list[list[tuple[str, str]]]]:
        """Each host id's sink inboxes: one per machine it ran on."""
        return {host_id: [read_sink(m) for m in ms] for host_id, ms in self.machines.items()}
