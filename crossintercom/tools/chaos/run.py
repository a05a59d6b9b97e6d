"""A chaos run: hosts up, senders sending, the injector injecting, then the drain and the count."""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from crossintercom.client import AsyncClient
from crossintercom.config import ENV_METRICS
from crossintercom.errors import Code, CrossintercomError
from crossintercom.models import Outcome, new_id
from crossintercom.tools.chaos import disk
from crossintercom.tools.chaos.faults import Injector, fault_kinds
from crossintercom.tools.chaos.gateway import ChaosGateway
from crossintercom.tools.chaos.report import ChaosReport, tally
from crossintercom.tools.chaos.rogue import delivery_reasons
from crossintercom.tools.chaos.state import (
    ACKNOWLEDGED,
    GATEWAY_HOST,
    SINK,
    ChaosState,
    RunSetup,
    Sent,
)
from crossintercom.tools.chaos.takeover import TAKEOVER_HEARTBEAT_S, TAKEOVER_LEASE_S
from crossintercom.tools.common import Store, prepare_store, scratch_dir, utc_now
from crossintercom.tools.harness import BULK_SENDER, Cluster, SimHost
from crossintercom.tools.pgcluster import ThrowawayPostgres
from crossintercom.tools.pgreplica import ReplicatedPostgres
from crossintercom.tools.proxy import TcpProxy

SENDERS_PER_HOST = 2
SAME_HOST_SHARE = 0.2
SEND_PAUSE_S = 0.01
NOT_SENT_PAUSE_S = 0.2
DRAIN_DEADLINE_S = 90.0
SEND_DEADLINE_S = 120.0


class Chaos(ChaosState):
    def __init__(
        self, setup: RunSetup, hosts: list[SimHost], duration: float, immutable: disk.Immutable
    ) -> None:
        super().__init__(setup, hosts)
        self.duration = duration
        self.immutable = immutable
        self._seq = 0

    async def _sender(self, src: int, k: int, stop: asyncio.Event) -> None:
        rng = random.Random(f"{self.setup.seed}:{src}:{k}")
        others = [i for i in range(len(self.hosts)) if i != src]
        while not stop.is_set():
            dst = src if rng.random() < SAME_HOST_SHARE else rng.choice(others)
            self._seq += 1
            seq = self._seq
            msg_id = new_id()
            sender, recipient = self.hosts[src].host_id, self.hosts[dst].host_id
            # The host's sender on the machine it runs on now (a takeover moves it), or the
            # remote session through the gateway.
            client = self._client(src, k)
            record = Sent(seq, msg_id, sender, recipient, "unknown", t=self.now())
            record.via_gateway = client is self.remote
            self.sent.append(record)
            text = f"chaos {self.token} seq={seq} from={sender}"
            try:
                r = await client.send(f"{SINK}@{recipient}", text, message_id=msg_id)
                record.outcome, record.code = r.outcome.value, r.code
            except CrossintercomError as exc:  # usage-level failures end up here
                record.outcome, record.code = Outcome.NOT_SENT, exc.code
            except asyncio.CancelledError:
                record.code = Code.ABANDONED
                raise
            # Nothing to send through right now (relay down): do not spin on not_sent.
            await asyncio.sleep(
                NOT_SENT_PAUSE_S if record.outcome == Outcome.NOT_SENT else SEND_PAUSE_S
            )

    def _client(self, src: int, k: int) -> AsyncClient:
        if self.remote is not None and src == GATEWAY_HOST and k == 1:
            return self.remote
        return self.clients[src]

    async def run(self) -> float:
        """Returns how long the drain took."""
        self.listeners = [h.listen(SINK) for h in self.hosts]
        self.clients = [AsyncClient(h.settings, h.identity("src", cwd="/")) for h in self.hosts]
        if "gateway_kill" in self.setup.kinds:
            self.gateway = ChaosGateway(self.hosts[GATEWAY_HOST])
            await asyncio.to_thread(self.gateway.grant)
            await asyncio.to_thread(self.gateway.start)
            self.remote = self.gateway.client()
        try:
            for c in self.clients:
                await c.connect()
            if self.remote is not None:
                await self.remote.connect()
            await asyncio.to_thread(self._wait_sinks_listed)
            stop = asyncio.Event()
            self.t0 = time.monotonic()
            loop = asyncio.get_running_loop()
            senders = [
                loop.create_task(self._sender(i, k, stop))
                for i in range(len(self.hosts))
                for k in range(SENDERS_PER_HOST)
            ]
            injector = loop.create_task(Injector(self, self.immutable).loop(stop))
            await asyncio.sleep(self.duration)
            stop.set()
            await injector
            _done, pending = await asyncio.wait(senders, timeout=SEND_DEADLINE_S)
            for t in pending:
                t.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            await self.undo_all()
            await asyncio.to_thread(self._restart_everything)
            return await self._drain()
        finally:
            for c in [*self.clients, *self.retired_clients]:
                await c.close()
            if self.remote is not None:
                await self.remote.close()
            if self.gateway is not None:
                await asyncio.to_thread(self.gateway.stop)

    def _wait_sinks_listed(self) -> None:
        """Until every host lists every sink online: the roster has gone round."""
        for host in self.hosts:
            for other in self.hosts:
                host.wait_sees(SINK, other.host_id, timeout=60)

    def _restart_everything(self) -> None:
        if self.setup.proxy is not None:
            self.setup.proxy.resume()
        self.immutable.release_all()
        for host in self.hosts:
            if host.relay is None or host.relay.poll() is not None:
                host.start_relay(wait=False)
        # Every machine's: one a takeover left still holds mail it saved.
        for machine in self.every_machine():
            for listener in machine.listeners:
                if not listener.alive():
                    listener.restart()

    async def _drain(self) -> float:
        t0 = time.monotonic()
        want: dict[str, set[str]] = {}
        for s in self.sent:
            if s.outcome in ACKNOWLEDGED:
                want.setdefault(s.recipient_host, set()).add(s.id)
        while time.monotonic() - t0 < DRAIN_DEADLINE_S:
            inboxes = await asyncio.to_thread(self.inboxes)
            missing = sum(
                len(ids - {i for inbox in inboxes.get(host, []) for i, _ in inbox})
                for host, ids in want.items()
            )
            if missing == 0 and await asyncio.to_thread(self._hostile_settled):
                break
            await asyncio.sleep(0.5)
        return time.monotonic() - t0

    def _hostile_settled(self) -> bool:
        """Every injected row has left the queue (refused, one hopes)."""
        states = delivery_reasons(self.store.url, list(self.injected))
        return all(states.get(mid, ("queued", None))[0] != "queued" for mid in self.injected)


def _proxied(store: Store, proxy: TcpProxy) -> str:
    """The store URL with its host and port replaced by the proxy's."""
    url = store.parsed.url.set(drivername="postgresql", host="127.0.0.1", port=proxy.port)
    return url.render_as_string(hide_password=False)


def select_kinds(
    store: Store,
    root: Path,
    faults: list[str] | None,
    own_server: bool,
    replicated: bool = False,
) -> tuple[list[str], dict[str, str], list[str]]:
    """The kinds to inject, those this machine cannot (kind -> why), and those of them asked
    for by name. ``replicated``: the store is the run's primary + standby."""
    applicable = fault_kinds(store.kind, faults, own_server=own_server)
    unavailable = disk.unavailable(root, applicable) | _replica_conflicts(applicable, replicated)
    kinds = [k for k in applicable if k not in unavailable]
    not_run = [k for k in faults or [] if k in unavailable]
    if not kinds:
        why = "; ".join(f"{k}: {v}" for k, v in unavailable.items())
        raise ValueError(
            f"none of the fault kinds asked for can run on {store.kind} here"
            + (f" ({why})" if why else "")
        )
    return kinds, unavailable, not_run


PROXIED = ("pg_blackhole", "pg_cut")


def _replica_conflicts(kinds: list[str], replicated: bool) -> dict[str, str]:
    """A primary + standby (pg_failover) has two addresses; the proxy faults hold one."""
    if replicated:
        why = "needs one server behind the run's proxy; not with pg_failover's two servers"
        return {k: why for k in kinds if k in PROXIED}
    if "pg_failover" in kinds:
        return {
            "pg_failover": "asked for by name only: it needs a primary + standby "
            "(--own-postgres --faults pg_failover), which the proxy faults cannot use"
        }
    return {}


def run_chaos(
    store_url: str | None = None,
    *,
    hosts: int = 3,
    duration: float = 30.0,
    seed: int = 1,
    faults: list[str] | None = None,
    own_postgres: bool = False,
    synchronous: bool = True,
    metrics_ports: Sequence[int] = (),
    before_stop: Callable[[], None] | None = None,
) -> ChaosReport:
    """``own_postgres``: the store is a throwaway PostgreSQL cluster started for this run (and
    removed after it), which the ``pg_restart`` fault may restart; not with ``store_url``.
    With ``pg_failover`` asked for by name it is a primary + streaming standby, synchronous
    unless ``synchronous=False``. ``metrics_ports``: host i's relay serves its metrics on
    127.0.0.1 at the i-th port; ``before_stop``: called once everything is drained, before
    the hosts stop (a scraper's last look)."""
    if own_postgres and store_url:
        raise ValueError("own_postgres starts its own server: give no store URL with it")
    started = time.monotonic()
    with scratch_dir("ci-chaos-") as root, contextlib.ExitStack() as stack:
        server: ThrowawayPostgres | None = None
        replica: ReplicatedPostgres | None = None
        label = "throwaway PostgreSQL cluster"
        if own_postgres and "pg_failover" in (faults or []):
            replica = stack.enter_context(ReplicatedPostgres(synchronous=synchronous))
            store_url = replica.create_database("chaos")
            mode = "synchronous" if synchronous else "asynchronous"
            label = f"throwaway PostgreSQL primary + {mode} standby"
        elif own_postgres:
            server = stack.enter_context(ThrowawayPostgres())
            store_url = server.url
        store = prepare_store(store_url, root)
        if own_postgres:
            store = Store(store.url, store.parsed, label)
        kinds, unavailable, not_run = select_kinds(
            store, root, faults, own_postgres, replicated=replica is not None
        )
        proxy: TcpProxy | None = None
        relay_url = store.url
        if store.kind == "postgres" and set(PROXIED) & set(kinds):
            url = store.parsed.url
            proxy = stack.enter_context(TcpProxy(url.host or "127.0.0.1", url.port or 5432))
            relay_url = _proxied(store, proxy)
        report = ChaosReport(
            backend=store.kind,
            store=store.label,
            hosts=hosts,
            duration_s=duration,
            seed=seed,
            date=utc_now(),
            unavailable=unavailable,
            not_run=not_run,
        )
        config = dict(BULK_SENDER)
        if "relay_takeover" in kinds:
            config["lease_s"] = TAKEOVER_LEASE_S
            config["heartbeat_s"] = TAKEOVER_HEARTBEAT_S
        immutable = disk.Immutable()

        def on_tmpfs(machine: SimHost) -> None:
            failed = disk.mount_tmpfs(machine.home)
            if failed is not None:
                raise RuntimeError(f"cannot mount a tmpfs for disk_full: {failed}")
            stack.callback(disk.unmount, machine.home)

        # On the stack, so that the files are released, the tmpfs unmounted, once the cluster
        # has stopped every process.
        stack.callback(immutable.release_all)
        token = secrets.token_hex(3)
        with Cluster(root, relay_url, SimHost) as cluster:
            setup = RunSetup(
                store,
                kinds,
                seed,
                token,
                cluster,
                config,
                proxy=proxy,
                server=server,
                replica=replica,
                prepare_home=on_tmpfs if "disk_full" in kinds else None,
            )
            sims = [cluster.host(f"h{i}-{token}", relay=False) for i in range(hosts)]
            for sim, port in zip(sims, metrics_ports, strict=False):
                sim.env[ENV_METRICS] = f"127.0.0.1:{port}"
            for sim in sims:
                if setup.prepare_home is not None:
                    setup.prepare_home(sim)
                sim.configure(**config)
                sim.start_relay(wait=False)
            for sim in sims:
                sim.wait_relay()
            chaos = Chaos(setup, sims, duration, immutable)
            report.drain_s = round(asyncio.run(chaos.run()), 2)
            if before_stop is not None:
                before_stop()
        tally(chaos, report)  # every listener has stopped: the inboxes are final
    report.elapsed_s = round(time.monotonic() - started, 1)
    return report
