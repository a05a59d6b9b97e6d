"""One cluster's measurements: raw baseline and crossintercom path back to back, in rounds.

Hosts, all over the one store: ``alpha`` (the senders, and same-host sinks), ``beta`` (the
cross-host sinks and an ask replier) and ``gamma`` (same-host sinks at ``durability`` ``full``;
it also fills the backlog for the catch-up, with a short ``remote_ack_wait_s`` so that queuing
10,000 messages does not wait 5 s per send). Every round measures each pair in turn: the raw
baseline, then the crossintercom path it is paired with; on PostgreSQL, with the peer
installed, the peer's phase follows crossintercom's (``peer``). The cross-host sequential and
throughput phases also count their CPU per delivered message (``cpu``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossintercom.client import AsyncClient
from crossintercom.config import ENV_METRICS
from crossintercom.tools.bench import paths
from crossintercom.tools.bench.baselines import RawPostgres, RawSQLite, RawUDS
from crossintercom.tools.bench.cpu import CpuAccount, run_processes
from crossintercom.tools.bench.peer import Peer
from crossintercom.tools.bench.report import percentile
from crossintercom.tools.bench.workload import Counts
from crossintercom.tools.harness import BULK_SENDER, Cluster, SimHost
from crossintercom.tools.pgcluster import free_port

MS = 1000.0
# How often ``bench --metrics`` reads each relay's endpoint (Prometheus's default is 15 s).
SCRAPE_S = 1.0

# A full run saves more than the default inbox bound (10,000 shown messages) per sink, and the
# catch-up counts what the inboxes hold: with the bound, old entries pruned meanwhile would keep
# the count from ever reaching the backlog.
BENCH_HOST: dict[str, float] = {**BULK_SENDER, "inbox_max_entries": 10_000_000}


@dataclass
class Rounds:
    """Per figure key, each round's (crossintercom, raw) value."""

    values: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    # Each backlog catch-up's rate (msg/s).
    drains: list[float] = field(default_factory=list)
    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    store_work: dict[str, Any] | None = None
    # Every `delivered` sample (ms) with its raw round trip, by path: the chart's curves.
    samples: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # Per figure key, each round's (crossintercom, peer) value, and the peer's own CPU.
    peer: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    # Per phase, each round's CPU ms per message by role ("total" summed), ours and the peer's.
    cpu: dict[str, list[dict[str, float]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, key: str, ci: float, raw: float) -> None:
        self.values[key].append((ci, raw))

    def latency(
        self, prefix: str, seq: paths.Sequential, raw_one: list[float], raw_rtt: list[float]
    ) -> None:
        """One round of sequential sends: one-way beside one-way, delivered beside a round
        trip."""
        self.add(f"{prefix}_one_way_p50", _p(seq.one_way, 50), _p(raw_one, 50))
        self.add(f"{prefix}_delivered_p50", _p(seq.delivered, 50), _p(raw_rtt, 50))
        self.add(f"{prefix}_delivered_p99", _p(seq.delivered, 99), _p(raw_rtt, 99))
        self.outcomes[f"{prefix}_latency"] += seq.outcomes
        self.samples[prefix] += [v * MS for v in seq.delivered]
        self.samples[f"{prefix} raw"] += [v * MS for v in raw_rtt]


def _p(samples: list[float], q: float) -> float:
    return percentile(samples, q) * MS


class ClusterBench:
    def __init__(
        self,
        root: Path,
        store_url: str,
        kind: str,
        counts: Counts,
        step: Callable[[str], None],
        token: str,
    ) -> None:
        self.root, self.store_url, self.kind = root, store_url, kind
        self.counts, self.step = counts, step
        self.ids = [f"bench-{h}-{token}" for h in ("alpha", "beta", "gamma")]
        self.sinks = [f"sink{k}" for k in range(counts.receivers)]
        self.conninfo: str | None = None  # the store's, when PostgreSQL: its backends' CPU
        self.peer: Peer | None = None
        # ``bench --metrics``: each relay serves its metrics and is scraped every SCRAPE_S.
        self.metrics = False
        self.scrapes = 0

    def _up(self, cluster: Cluster[SimHost]) -> list[SimHost]:
        hosts = [cluster.host(h, relay=False) for h in self.ids]
        for h in hosts[:2]:
            h.configure(**BENCH_HOST)
        (hosts[2].home / "config.json").write_text(
            json.dumps({**BENCH_HOST, "durability": "full", "remote_ack_wait_s": 0.01})
        )
        for h in hosts:
            if self.metrics:
                h.env[ENV_METRICS] = f"127.0.0.1:{free_port()}"
            h.start_relay(wait=False)
        for h in hosts:
            h.wait_relay(60)
        for h in hosts:
            for name in self.sinks:
                h.listen(name)
        for name in self.sinks:
            for h in hosts:
                hosts[0].wait_sees(name, h.host_id, timeout=60)
                hosts[2].wait_sees(name, h.host_id, timeout=60)
        return hosts

    def run(
        self,
        uds: RawUDS | None,
        store: RawPostgres | RawSQLite,
        conninfo: str | None,
        peer: Peer | None = None,
    ) -> Rounds:
        self.conninfo, self.peer = conninfo, peer
        with Cluster(self.root, self.store_url, SimHost) as cluster:
            hosts = self._up(cluster)
            self.step(f"{self.kind} hosts up")
            with self._scraping(hosts):
                return asyncio.run(self._measure(hosts, uds, store, conninfo))

    @contextlib.contextmanager
    def _scraping(self, hosts: list[SimHost]) -> Iterator[None]:
        """With ``metrics``: every relay's endpoint read every SCRAPE_S from a thread, as a
        Prometheus server would (more often than its usual 15 s), while the rounds run."""
        if not self.metrics:
            yield
            return
        urls = [f"http://{h.env[ENV_METRICS]}/metrics" for h in hosts]
        done = threading.Event()

        def scrape() -> None:
            while not done.wait(SCRAPE_S):
                for url in urls:
                    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
                        r.read()
                        self.scrapes += 1

        thread = threading.Thread(target=scrape, name="bench-scraper", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(10)

    def _cpu(self) -> CpuAccount:
        """CPU of every process of this cluster, the senders' thread and the store's backends."""
        return CpuAccount(lambda: run_processes(self.root), self.conninfo)

    async def _measure(
        self,
        hosts: list[SimHost],
        uds: RawUDS | None,
        store: RawPostgres | RawSQLite,
        conninfo: str | None,
    ) -> Rounds:
        alpha, beta, gamma = hosts
        c, out = self.counts, Rounds()
        senders = [
            AsyncClient(alpha.settings, alpha.identity(f"bench-s{k}", cwd="/"))
            for k in range(c.senders)
        ]
        full = AsyncClient(gamma.settings, gamma.identity("bench-full", cwd="/"))
        replier = AsyncClient(beta.settings, beta.identity("replier", cwd="/"))
        clients = [*senders, full, replier]
        try:
            for client in clients:
                await client.connect()
            await asyncio.to_thread(alpha.wait_sees, "replier", beta.host_id)
            s0, sink = senders[0], self.sinks[0]
            for host, client in ((alpha, s0), (beta, s0), (gamma, full)):  # warm-up
                await paths.sequential(client, host, sink, c.warm_up)
            if self.peer is not None:
                await asyncio.to_thread(self.peer.one_way, c.warm_up)
            for r in range(c.repeats):
                if uds is not None:
                    await self._same_host(out, uds, senders, full, alpha, gamma)
                await self._cross_host(out, store, senders, replier, beta)
                self.step(f"{self.kind} round {r + 1}/{c.repeats}")
            for r in range(c.drains):
                rate, got = await paths.catch_up(full, beta, self.sinks, c.backlog, c.window)
                out.drains.append(rate)
                out.outcomes["catch_up_fill"] += got
                if self.peer is not None:
                    drained = await asyncio.to_thread(self.peer.drain, c.backlog)
                    out.peer["catch_up"].append((rate, drained))
                self.step(f"{self.kind} backlog catch-up {r + 1}/{c.drains}")
            if conninfo is not None:
                from crossintercom.tools.bench.store_work import per_message

                async def send(n: int) -> int:
                    seq = await paths.sequential(s0, beta, sink, n)
                    out.outcomes["store_work"] += seq.outcomes
                    return seq.outcomes["delivered"]

                out.store_work = await per_message(
                    conninfo, send, c.latency, asyncio.sleep, relays=len(hosts)
                )
                self.step("store work counted")
        finally:
            for client in clients:
                await client.close()
        return out

    async def _same_host(
        self,
        out: Rounds,
        uds: RawUDS,
        senders: list[AsyncClient],
        full: AsyncClient,
        alpha: SimHost,
        gamma: SimHost,
    ) -> None:
        n, sink = self.counts.latency, self.sinks[0]
        raw_one = await uds.one_way(n)
        seq = await paths.sequential(senders[0], alpha, sink, n)
        raw_rtt = await uds.round_trip(n)
        seq_full = await paths.sequential(full, gamma, sink, n)
        out.latency("same", seq, raw_one, raw_rtt)
        out.latency("full", seq_full, raw_one, raw_rtt)
        total, window = self.counts.throughput, self.counts.window
        raw_rate = await uds.pipelined(total, self.counts.senders, window)
        rate, got = await paths.throughput(senders, alpha, self.sinks, total, window)
        out.add("same_throughput", rate, raw_rate)
        out.outcomes["same_throughput"] += got

    async def _cross_host(
        self,
        out: Rounds,
        store: RawPostgres | RawSQLite,
        senders: list[AsyncClient],
        replier: AsyncClient,
        beta: SimHost,
    ) -> None:
        c, sink = self.counts, self.sinks[0]
        raw_one = await asyncio.to_thread(store.one_way, c.latency)
        cpu = self._cpu()
        cpu.start()
        seq = await paths.sequential(senders[0], beta, sink, c.latency)
        out.cpu["sequential"].append(cpu.stop(seq.outcomes["delivered"] + seq.outcomes["queued"]))
        if self.peer is not None:
            peer_one, peer_cpu = await asyncio.to_thread(self.peer.one_way, c.latency)
            out.peer["cross_one_way_p50"].append((_p(seq.one_way, 50), _p(peer_one, 50)))
            out.cpu["peer sequential"].append(peer_cpu)
        raw_rtt = await asyncio.to_thread(store.round_trip, c.latency)
        asks = await paths.ask_reply(senders[0], replier, f"replier@{beta.host_id}", c.asks)
        out.latency("cross", seq, raw_one, raw_rtt)
        out.add("ask_reply_p50", _p(asks.delivered, 50), _p(raw_rtt, 50))
        out.outcomes["ask_reply"] += asks.outcomes
        if isinstance(store, RawPostgres):
            raw_rate = await asyncio.to_thread(store.batched_claim, c.raw_rows, c.batch)
        else:
            raw_rate = await asyncio.to_thread(store.tx_rate, c.raw_tx)
        cpu = self._cpu()
        cpu.start()
        rate, got = await paths.throughput(senders, beta, self.sinks, c.throughput, c.window)
        out.cpu["throughput"].append(cpu.stop(sum(got.values())))
        out.add("cross_throughput", rate, raw_rate)
        out.outcomes["cross_throughput"] += got
        if self.peer is not None:
            peer_rate, peer_cpu = await asyncio.to_thread(
                self.peer.throughput, c.throughput, len(senders), c.window
            )
            out.peer["cross_throughput"].append((rate, peer_rate))
            out.cpu["peer throughput"].append(peer_cpu)
