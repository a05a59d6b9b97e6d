"""`crossintercom chaos`: several simulated hosts exchange mail while faults are injected.

Each host is what a machine runs (its own runtime dir, host id, broker and relay process, see
``harness.SimHost``) plus a durable listener process (`crossintercom listen --as sink`). A sender
client per host (Python API, in this process) sends continuously to the sinks of the other hosts
and, now and then, to its own host's sink. At seeded random moments one of these faults hits one
host:

* ``relay_kill``: SIGKILL of the relay, restarted a moment later;
* ``relay_pause``: SIGSTOP of the relay (a frozen process, a paused VM), SIGCONT a moment later;
* ``broker_kill``: SIGKILL of the broker; clients and the relay reconnect and respawn it;
* ``listener_kill``: SIGKILL of the listener, restarted a moment later (it resumes its mail);
* ``pg_terminate`` (PostgreSQL only): ``pg_terminate_backend`` of every other connection to the
  store's database, that is the relays' pooled and LISTEN connections;
* ``pg_blackhole`` (PostgreSQL only): the relays reach the store through a TCP proxy of the run's
  own (``proxy.TcpProxy``); it holds all traffic both ways, released a moment later;
* ``pg_cut`` (PostgreSQL only): the proxy resets every relay connection at once;
* ``pg_restart`` (only with ``own_postgres``: a throwaway cluster the run started itself, never a
  server anybody else uses): a fast restart of the PostgreSQL server;
* ``hostile_rows``: a rogue host writes malformed or forged rows straight into the store,
  addressed to a host's sink; each must be refused (quarantined) with its reason, once, and
  never reach an inbox.

At the end everything is restarted, the listeners drain (with a deadline), and every sink's inbox
is compared with what the senders were told:

* lost: an acknowledged (``delivered`` / ``queued``) message missing from its recipient's inbox;
* duplicated: a message id, or a sequence number carried in the text, seen twice in one inbox
  (client retries reuse the id, so the same sequence number under two ids is a duplicate too);
* phantom (reported, not a failure of this run): a ``not_sent`` message found in an inbox;
* quarantined: an injected hostile row the receiving relay refused.

``by_fault`` splits these per fault kind: a message counts under the last fault injected before
it was sent (``none`` before the first).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import re
import secrets
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from crossintercom.client import AsyncClient
from crossintercom.errors import CrossintercomError
from crossintercom.models import new_id
from crossintercom.storage.rogue import (
    HOSTILE_KINDS,
    delivery_reasons,
    hostile_payload,
    inject_rows,
)
from crossintercom.tools.common import Store, prepare_store, scratch_dir, utc_now
from crossintercom.tools.harness import BULK_SENDER, Cluster, ListenerProcess, SimHost
from crossintercom.tools.pgcluster import ThrowawayPostgres
from crossintercom.tools.proxy import TcpProxy

SINK = "sink"
SENDERS_PER_HOST = 2
SAME_HOST_SHARE = 0.2
SEND_PAUSE_S = 0.01
NOT_SENT_PAUSE_S = 0.2
DRAIN_DEADLINE_S = 90.0
SEND_DEADLINE_S = 120.0
ACKNOWLEDGED = ("delivered", "queued")
# One of each kind per fault: a handful, so the rows behind them are not held up by volume.
HOSTILE_PER_FAULT = len(HOSTILE_KINDS)
FAULT_KINDS = (
    "relay_kill",
    "relay_pause",
    "broker_kill",
    "listener_kill",
    "pg_terminate",
    "pg_blackhole",
    "pg_cut",
    "pg_restart",
    "hostile_rows",
)
PG_ONLY = frozenset({"pg_terminate", "pg_blackhole", "pg_cut", "pg_restart"})
# Only against a server the run started itself.
OWN_SERVER_ONLY = frozenset({"pg_restart"})
_SEQ = re.compile(r"\bseq=(\d+)\b")


@dataclass
class Sent:
    seq: int
    id: str
    sender_host: str
    recipient_host: str
    outcome: str
    code: str | None = None
    t: float = 0.0  # when it was sent, from the start of traffic


@dataclass
class ChaosReport:
    backend: str
    store: str
    hosts: int
    duration_s: float
    seed: int
    date: str
    attempted: int = 0
    acknowledged: int = 0
    delivered: int = 0
    queued: int = 0
    unknown: int = 0
    not_sent: int = 0
    refused: int = 0
    lost: int = 0
    duplicated: int = 0
    duplicated_by_id: int = 0
    phantom: int = 0
    injected: int = 0
    quarantined: int = 0
    # Injected rows not refused by the end (still queued, or delivered), and any in an inbox.
    unquarantined: int = 0
    hostile_in_inboxes: int = 0
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    in_inboxes: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    by_fault: dict[str, dict[str, int]] = field(default_factory=dict)
    codes: dict[str, int] = field(default_factory=dict)
    lost_ids: list[str] = field(default_factory=list)
    drain_s: float = 0.0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.quarantined == self.injected
            and self.hostile_in_inboxes == 0
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


def read_sink(host: SimHost) -> list[tuple[str, str]]:
    """(message id, text) of every message saved in the sink's inbox on ``host``."""
    with host.open_inbox(SINK) as inbox:
        return [(e.id, str(e.body.get("message", ""))) for e in inbox.messages()]


def _pg_terminate(store: Store) -> int:
    import psycopg

    with psycopg.connect(store.parsed.libpq_conninfo(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        ).fetchall()
    return sum(1 for r in rows if r[0])


class Chaos:
    def __init__(
        self,
        store: Store,
        hosts: list[SimHost],
        duration: float,
        seed: int,
        token: str,
        *,
        kinds: list[str],
        proxy: TcpProxy | None = None,
        server: ThrowawayPostgres | None = None,
    ) -> None:
        self.store = store
        self.kinds = kinds
        self.proxy = proxy
        self.server = server
        self.hosts = hosts
        self.listeners: list[ListenerProcess] = []  # one per host, started by ``run``
        self.duration = duration
        self.rng = random.Random(seed)
        self.seed = seed
        self.token = token
        self.sent: list[Sent] = []
        self.faults: Counter[str] = Counter()
        self.fault_log: list[dict[str, Any]] = []
        self._seq = 0
        self.injected: dict[str, str] = {}  # hostile row id -> its kind
        self.rogue_host = f"rogue-{token}"
        self._restarts: set[asyncio.Task[None]] = set()
        self._t0 = 0.0

    # -- senders ------------------------------------------------------------------------

    async def _sender(self, client: AsyncClient, src: int, k: int, stop: asyncio.Event) -> None:
        rng = random.Random(f"{self.seed}:{src}:{k}")
        others = [i for i in range(len(self.hosts)) if i != src]
        while not stop.is_set():
            dst = src if rng.random() < SAME_HOST_SHARE else rng.choice(others)
            self._seq += 1
            seq = self._seq
            msg_id = new_id()
            sender, recipient = self.hosts[src].host_id, self.hosts[dst].host_id
            target = f"{SINK}@{recipient}"
            record = Sent(seq, msg_id, sender, recipient, "unknown", t=self._now())
            self.sent.append(record)
            text = f"chaos {self.token} seq={seq} from={sender}"
            try:
                r = await client.send(target, text, message_id=msg_id)
                record.outcome, record.code = r.outcome.value, r.code
            except CrossintercomError as exc:  # usage-level failures end up here
                record.outcome, record.code = "not_sent", exc.code
            except asyncio.CancelledError:
                record.code = "abandoned"
                raise
            # Nothing to send through right now (relay down): do not spin on not_sent.
            await asyncio.sleep(NOT_SENT_PAUSE_S if record.outcome == "not_sent" else SEND_PAUSE_S)

    # -- faults -------------------------------------------------------------------------

    def _later(self, delay: float, fn: Callable[[], object]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            await asyncio.to_thread(fn)

        task = asyncio.get_running_loop().create_task(run())
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    def _now(self) -> float:
        return round(time.monotonic() - self._t0, 3)

    def _inject_hostile(self, victim: SimHost, claimed: SimHost) -> int:
        rows = []
        for kind in HOSTILE_KINDS:
            mid = new_id()
            payload = hostile_payload(
                kind, mid, rogue_host=self.rogue_host, claimed_host=claimed.host_id
            )
            rows.append((mid, payload))
            self.injected[mid] = kind
        inject_rows(
            self.store.url,
            rows,
            sender_host=self.rogue_host,
            recipient_host=victim.host_id,
            recipient_session=victim.session_id(SINK),
        )
        return len(rows)

    async def _inject(self, stop: asyncio.Event) -> None:
        kinds = self.kinds
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(0.5, 2.5))
            if stop.is_set():
                return
            kind = self.rng.choice(kinds)
            i = self.rng.randrange(len(self.hosts))
            host, listener = self.hosts[i], self.listeners[i]
            delay = self.rng.uniform(0.2, 2.0)
            detail: Any = None
            if kind == "relay_kill":
                if host.relay is None or host.relay.poll() is not None:
                    continue  # still down from an earlier fault
                await asyncio.to_thread(host.kill_relay)
                self._later(delay, functools.partial(host.start_relay, wait=False))
            elif kind == "relay_pause":
                proc = host.relay
                if proc is None or proc.poll() is not None:
                    continue
                proc.send_signal(signal.SIGSTOP)
                self._later(delay, functools.partial(_resume, proc))
            elif kind == "broker_kill":
                if not host.kill_broker():
                    continue
            elif kind == "listener_kill":
                if not listener.alive():
                    continue
                await asyncio.to_thread(listener.kill)
                self._later(delay, listener.restart)
            elif kind == "pg_blackhole":
                assert self.proxy is not None
                self.proxy.blackhole()
                delay = self.rng.uniform(1.0, 3.0)
                self._later(delay, self.proxy.resume)
            elif kind == "pg_cut":
                assert self.proxy is not None
                detail = self.proxy.cut()
            elif kind == "pg_restart":
                assert self.server is not None
                started = time.monotonic()
                await asyncio.to_thread(self.server.restart)
                detail = round(time.monotonic() - started, 2)
            elif kind == "hostile_rows":
                claimed = self.hosts[(i + 1) % len(self.hosts)]
                detail = await asyncio.to_thread(self._inject_hostile, host, claimed)
            else:
                detail = await asyncio.to_thread(_pg_terminate, self.store)
            self.faults[kind] += 1
            entry: dict[str, Any] = {"t": self._now(), "fault": kind, "host": host.host_id}
            if kind in ("pg_blackhole", "pg_cut", "pg_restart"):
                entry["host"] = "all"  # every relay's store connections go through the proxy
            if kind in ("relay_kill", "relay_pause", "listener_kill", "pg_blackhole"):
                entry["restart_after_s"] = round(delay, 2)
            if kind in ("pg_terminate", "pg_cut"):
                entry["terminated"] = detail
            elif kind == "hostile_rows":
                entry["injected"] = detail
            elif kind == "pg_restart":
                entry["restart_took_s"] = detail
            self.fault_log.append(entry)

    # -- the run ------------------------------------------------------------------------

    async def run(self) -> float:
        """Returns how long the drain took."""
        self.listeners = [h.listen(SINK) for h in self.hosts]
        clients = [AsyncClient(h.settings, h.identity("src", cwd="/")) for h in self.hosts]
        try:
            for c in clients:
                await c.connect()
            await asyncio.to_thread(self._wait_sinks_listed)
            stop = asyncio.Event()
            self._t0 = time.monotonic()
            senders = [
                asyncio.get_running_loop().create_task(self._sender(c, i, k, stop))
                for i, c in enumerate(clients)
                for k in range(SENDERS_PER_HOST)
            ]
            injector = asyncio.get_running_loop().create_task(self._inject(stop))
            await asyncio.sleep(self.duration)
            stop.set()
            await injector
            _done, pending = await asyncio.wait(senders, timeout=SEND_DEADLINE_S)
            for t in pending:
                t.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            if self._restarts:
                await asyncio.gather(*self._restarts, return_exceptions=True)
            await asyncio.to_thread(self._restart_everything)
            return await self._drain()
        finally:
            for c in clients:
                await c.close()

    def _wait_sinks_listed(self) -> None:
        """Until every host lists every sink online: the roster has gone round."""
        for host in self.hosts:
            for other in self.hosts:
                host.wait_sees(SINK, other.host_id, timeout=60)

    def _restart_everything(self) -> None:
        if self.proxy is not None:
            self.proxy.resume()
        for host, listener in zip(self.hosts, self.listeners, strict=True):
            if host.relay is None or host.relay.poll() is not None:
                host.start_relay(wait=False)
            if not listener.alive():
                listener.restart()

    async def _drain(self) -> float:
        t0 = time.monotonic()
        want: dict[str, set[str]] = {}
        for s in self.sent:
            if s.outcome in ACKNOWLEDGED:
                want.setdefault(s.recipient_host, set()).add(s.id)
        by_id = {h.host_id: h for h in self.hosts}
        while time.monotonic() - t0 < DRAIN_DEADLINE_S:
            missing = 0
            for host, ids in want.items():
                have = {i for i, _ in await asyncio.to_thread(read_sink, by_id[host])}
                missing += len(ids - have)
            if missing == 0 and await asyncio.to_thread(self._hostile_settled):
                break
            await asyncio.sleep(0.5)
        return time.monotonic() - t0

    def _hostile_settled(self) -> bool:
        """Every injected row has left the queue (refused, one hopes)."""
        states = delivery_reasons(self.store.url, list(self.injected))
        return all(states.get(mid, ("queued", None))[0] != "queued" for mid in self.injected)

    def _fault_at(self, t: float) -> str:
        kind = "none"
        for entry in self.fault_log:  # in time order
            if entry["t"] > t:
                break
            kind = entry["fault"]
        return kind

    def tally(self, report: ChaosReport) -> None:
        outcomes = Counter(s.outcome for s in self.sent)
        report.attempted = len(self.sent)
        report.delivered = outcomes["delivered"]
        report.queued = outcomes["queued"]
        report.acknowledged = report.delivered + report.queued
        report.unknown = outcomes["unknown"]
        report.not_sent = outcomes["not_sent"]
        report.refused = outcomes["refused"]
        report.codes = dict(
            Counter(f"{s.outcome}:{s.code}" for s in self.sent if s.code is not None)
        )
        inboxes = {h.host_id: read_sink(h) for h in self.hosts}
        mine = re.compile(rf"^chaos {re.escape(self.token)} ")
        by_seq = {s.seq: s for s in self.sent}
        by_fault: dict[str, Counter[str]] = {}

        def count(kind: str, what: str, n: int = 1) -> None:
            by_fault.setdefault(kind, Counter())[what] += n

        for entries in inboxes.values():
            ids = Counter(i for i, _ in entries)
            seqs = Counter(
                int(m.group(1)) for _, t in entries if mine.match(t) and (m := _SEQ.search(t))
            )
            report.in_inboxes += len(entries)
            report.duplicated_by_id += sum(c - 1 for c in ids.values() if c > 1)
            report.duplicated += sum(c - 1 for c in seqs.values() if c > 1)
            for seq, c in seqs.items():
                if c > 1 and seq in by_seq:
                    count(self._fault_at(by_seq[seq].t), "duplicated", c - 1)
        report.duplicated = max(report.duplicated, report.duplicated_by_id)
        held = {name: {i for i, _ in entries} for name, entries in inboxes.items()}
        for s in self.sent:
            kind = self._fault_at(s.t)
            count(kind, "sent")
            present = s.id in held.get(s.recipient_host, set())
            if s.outcome in ACKNOWLEDGED and not present:
                report.lost += 1
                report.lost_ids.append(s.id)
                count(kind, "lost")
            elif s.outcome == "not_sent" and present:
                report.phantom += 1
                count(kind, "phantom")
        states = delivery_reasons(self.store.url, list(self.injected))
        anywhere = set().union(*held.values()) if held else set()
        reasons: Counter[str] = Counter()
        for mid in self.injected:
            state, reason = states.get(mid, ("missing", None))
            if state == "refused":
                report.quarantined += 1
                reasons[str(reason)] += 1
            else:
                report.unquarantined += 1
            if mid in anywhere:
                report.hostile_in_inboxes += 1
        report.injected = len(self.injected)
        report.quarantine_reasons = dict(reasons)
        if self.injected:
            count("hostile_rows", "injected", report.injected)
            count("hostile_rows", "quarantined", report.quarantined)
        report.by_fault = {
            kind: {
                k: c[k]
                for k in ("sent", "lost", "duplicated", "phantom", "injected", "quarantined")
            }
            for kind, c in sorted(by_fault.items())
        }
        report.faults = dict(self.faults)
        report.fault_log = self.fault_log


def fault_kinds(
    backend: str, wanted: list[str] | None = None, *, own_server: bool = False
) -> list[str]:
    """The fault kinds a run on ``backend`` injects: ``wanted`` (default all) less those that do
    not apply to it."""
    kinds = wanted or list(FAULT_KINDS)
    unknown = set(kinds) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    return [
        k
        for k in kinds
        if (backend == "postgres" or k not in PG_ONLY) and (own_server or k not in OWN_SERVER_ONLY)
    ]


def _proxied(store: Store, proxy: TcpProxy) -> str:
    """The store URL with its host and port replaced by the proxy's."""
    url = store.parsed.url.set(drivername="postgresql", host="127.0.0.1", port=proxy.port)
    return url.render_as_string(hide_password=False)


def run_chaos(
    store_url: str | None = None,
    *,
    hosts: int = 3,
    duration: float = 30.0,
    seed: int = 1,
    faults: list[str] | None = None,
    own_postgres: bool = False,
) -> ChaosReport:
    """``own_postgres``: the store is a throwaway PostgreSQL cluster started for this run (and
    removed after it), which the ``pg_restart`` fault may restart; not with ``store_url``."""
    if own_postgres and store_url:
        raise ValueError("own_postgres starts its own server: give no store URL with it")
    started = time.monotonic()
    with scratch_dir("ci-chaos-") as root, contextlib.ExitStack() as stack:
        server: ThrowawayPostgres | None = None
        if own_postgres:
            server = stack.enter_context(ThrowawayPostgres())
            store_url = server.url
        store = prepare_store(store_url, root)
        if server is not None:
            store = Store(store.url, store.parsed, "throwaway PostgreSQL cluster")
        kinds = fault_kinds(store.kind, faults, own_server=server is not None)
        if not kinds:
            raise ValueError(f"none of the fault kinds asked for applies to {store.kind}")
        proxy: TcpProxy | None = None
        relay_url = store.url
        if store.kind == "postgres" and {"pg_blackhole", "pg_cut"} & set(kinds):
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
        )
        token = secrets.token_hex(3)
        with Cluster(root, relay_url, SimHost) as cluster:
            ids = [f"h{i}-{token}" for i in range(hosts)]
            sims = cluster.up(*ids, **dict.fromkeys(ids, BULK_SENDER))
            chaos = Chaos(
                store, sims, duration, seed, token, kinds=kinds, proxy=proxy, server=server
            )
            report.drain_s = round(asyncio.run(chaos.run()), 2)
        chaos.tally(report)  # every listener has stopped: the inboxes are final
    report.elapsed_s = round(time.monotonic() - started, 1)
    return report


def render(report: ChaosReport) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"crossintercom chaos: {report.backend} ({report.store}), {report.hosts} hosts, "
        f"{report.duration_s:g} s, seed {report.seed}, {report.date}"
    )
    table = Table()
    names = (
        "attempted",
        "acknowledged",
        "delivered",
        "queued",
        "unknown",
        "not_sent",
        "refused",
        "lost",
        "duplicated",
        "phantom",
        "injected",
        "quarantined",
    )
    table.add_column("count")
    table.add_column("messages", justify="right")
    for name in names:
        table.add_row(name, str(getattr(report, name)))
    console.print(table)
    faults = ", ".join(f"{k} x{v}" for k, v in sorted(report.faults.items())) or "none"
    console.print(f"  faults injected: {faults}")
    if report.by_fault:
        per = Table(title="per fault kind (a message counts under the last fault before it)")
        columns = ("sent", "lost", "duplicated", "phantom", "injected", "quarantined")
        per.add_column("fault")
        for name in columns:
            per.add_column(name, justify="right")
        for kind, c in report.by_fault.items():
            per.add_row(kind, *(str(c[n]) for n in columns))
        console.print(per)
    if report.quarantine_reasons:
        console.print(f"  quarantine reasons: {report.quarantine_reasons}")
    if report.codes:
        console.print(f"  outcome codes: {report.codes}")
    console.print(f"  drain took {report.drain_s} s; whole run {report.elapsed_s} s")
    verdict = "OK: nothing acknowledged was lost, nothing duplicated"
    if report.injected:
        verdict += f"; {report.quarantined} of {report.injected} hostile rows quarantined"
    if not report.ok:
        verdict = (
            f"FAILED: {report.lost} lost, {report.duplicated} duplicated, "
            f"{report.quarantined} of {report.injected} hostile rows quarantined, "
            f"{report.hostile_in_inboxes} in an inbox"
        )
    console.print(verdict)


def _resume(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGCONT)
