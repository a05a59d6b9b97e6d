"""`bench --scale` on PostgreSQL: many simulated hosts on one database beside two.

Two hosts first: a sender session on host 0, a `listen` sink on host 1, and the cross-host
``delivered`` p50 over sequential sends. Then ``hosts - 2`` more hosts (idle relays, each with
one session connected from the bench so its roster is not empty) until host 0 sees every one of
them live, and the same sends again; then those hosts are stopped and the two measured again;
and once more the same with new other hosts, alternated: two, many, two, many, two. The
latency figure is each many-host p50 beside the two-host ones just before and after it (issue
9's target: within 1.2x), the median of those four ratios.

Counted by the server while the many hosts are up: idle commits per second per relay (the
``pg_stat_database.xact_commit`` delta over a quiet window, less the bench's own reads, over
relays and seconds, the median of consecutive windows; target at most 0.2) and database
connections per host (each host's backends in ``pg_stat_activity``, told apart by the
``application_name`` its relay gives every connection: ``storage.engine.application_name``),
sampled idle and during the sends; the most on any host is the figure (target at most 1:
statements and LISTEN on one), beside the server's
``max_connections``. Then every host sends one message to the next one's session (a ring): each
must come back ``delivered``. And the memory of a host: its relay's and its broker's resident
set (``VmRSS``), median and most. ``rounds=1`` (``bench --scale --hosts N``): one crowd, between
two runs of the two alone. See docs/operations.md, "Sizing".
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from crossintercom.client import AsyncClient
from crossintercom.errors import CrossintercomError
from crossintercom.storage.engine import application_name
from crossintercom.tools.bench import paths
from crossintercom.tools.bench.report import Figure, percentile
from crossintercom.tools.bench.store_work import FLUSH_S, StoreCounters
from crossintercom.tools.harness import BULK_SENDER, Cluster, SimHost

LATENCY_TARGET = 1.2
# The runs of sends, in order: 2 hosts alone, then all, then 2 alone, all again, 2 alone.
TWOS = ["two", "two_again", "two_last"]
MANYS = ["many", "many_again"]
IDLE_COMMITS_CEILING = 0.2  # commits/s per idle relay: one heartbeat per lease_s / 3
CONNECTIONS_CEILING = 1  # database connections per host: statements and LISTEN on one
ROLES = ("relay",)
# Backends per application_name on the store's database, now.
BACKENDS = (
    "SELECT application_name, count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() GROUP BY application_name"
)
_SAMPLE_EVERY_S = 0.1
# After every host is seen live: their start-up work (claims, roster, catch-up) is done.
_SETTLE_S = 3.0
_WAIT_S = 120.0
_START_BATCH = 10
_TOP_STATEMENTS = 8
_STATEMENT_CHARS = 160


class Backends:
    """Each host's backends on the database, sampled now and then from a thread of its own:
    ``most`` per host, and ``roles``, the most of each role (connection kind) on any host."""

    def __init__(self, conninfo: str, host_ids: list[str]) -> None:
        self._conninfo = conninfo
        self._names = {application_name(r, h): (h, r) for h in host_ids for r in ROLES}
        self.most: dict[str, int] = {}
        self.roles: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: psycopg.Error | None = None

    def count(self, conn: psycopg.Connection[Any]) -> None:
        per_host = dict.fromkeys((h for h, _ in self._names.values()), 0)
        for name, n in conn.execute(BACKENDS).fetchall():
            host, role = self._names.get(str(name), (None, ""))
            if host is not None:
                per_host[host] += int(n)
                self.roles[role] = max(int(n), self.roles.get(role, 0))
        for host, n in per_host.items():
            self.most[host] = max(n, self.most.get(host, 0))

    def once(self) -> Backends:
        with psycopg.connect(self._conninfo, autocommit=True) as conn:
            self.count(conn)
        return self

    def _sample(self) -> None:
        try:
            with psycopg.connect(self._conninfo, autocommit=True) as conn:
                while True:  # once more after the stop: the pools are still open then
                    stopping = self._stop.is_set()
                    self.count(conn)
                    if stopping:
                        return
                    self._stop.wait(_SAMPLE_EVERY_S)
        except psycopg.Error as exc:
            self._failed = exc

    def __enter__(self) -> Backends:
        self._thread = threading.Thread(target=self._sample, name="bench-backends", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._failed is not None:
            raise CrossintercomError(f"could not count the hosts' backends: {self._failed}")


class HostsBench:
    def __init__(
        self,
        root: Path,
        store_url: str,
        conninfo: str,
        *,
        hosts: int,
        sends: int,
        quiet_s: float,
        token: str,
        step: Callable[[str], None],
        rounds: int = len(MANYS),
        windows: int = 1,
    ) -> None:
        self.store_url, self.conninfo = store_url, conninfo
        self.n, self.sends, self.quiet_s, self.step = hosts, sends, quiet_s, step
        self.windows = windows
        self.manys, self.twos = MANYS[:rounds], TWOS[: rounds + 1]
        self.ids = [f"bench-h{k:02d}-{token}" for k in range(hosts)]
        self.cluster = Cluster(root, store_url, SimHost)
        self.out: dict[str, Any] = {
            "hosts": hosts,
            "sends": sends,
            "quiet_s": quiet_s,
            "quiet_windows": windows,
        }

    def run(self) -> dict[str, Any]:
        with self.cluster:
            return asyncio.run(self._measure())

    async def _p50(self, sender: AsyncClient, sink_host: SimHost, key: str) -> float:
        """Sequential sends host 0 -> host 1, each host's backends sampled meanwhile."""
        with Backends(self.conninfo, [h.host_id for h in self.cluster.hosts]) as backends:
            seq = await paths.sequential(sender, sink_host, "sink0", self.sends)
        p50 = percentile(seq.delivered, 50) * 1000
        self.out[key] = {
            "delivered_p50_ms": p50,
            "delivered_p99_ms": percentile(seq.delivered, 99) * 1000,
            "outcomes": dict(seq.outcomes),
            "busy_connections": backends.most,
            "busy_connections_by_role": backends.roles,
        }
        return p50

    async def _measure(self) -> dict[str, Any]:
        a, b = await asyncio.to_thread(self._start, self.ids[:2])
        b.listen("sink0")
        await asyncio.to_thread(a.wait_sees, "sink0", b.host_id, timeout=_WAIT_S)
        sender = AsyncClient(a.settings, a.identity("scale-sender", cwd="/"))
        try:
            await sender.connect()
            await paths.sequential(sender, b, "sink0", 10)  # warm-up
            await self._p50(sender, b, self.twos[0])
            self.step("scale: 2 hosts measured")
            for r, (many, two) in enumerate(zip(self.manys, self.twos[1:], strict=True)):
                # New hosts each time (their dirs and ids): a stopped host is not started again.
                ids = [f"{i}-{r}" for i in self.ids[2:]] if r else self.ids[2:]
                await self._with_crowd(a, ids, sender, b, many, idle=r == 0)
                await self._p50(sender, b, two)
                self.step("scale: 2 hosts again")
        finally:
            await sender.close()
        return self.out

    async def _with_crowd(
        self,
        a: SimHost,
        ids: list[str],
        sender: AsyncClient,
        b: SimHost,
        key: str,
        *,
        idle: bool,
    ) -> None:
        """The other hosts up and seen live by host 0 (``idle``: their quiet window counted),
        the sends measured as ``key``, then those hosts stopped."""
        more = await asyncio.to_thread(self._start, ids)
        crowd: list[AsyncClient] = []
        try:
            for h in more:
                client = AsyncClient(h.settings, h.identity("scale-idle", cwd="/"))
                crowd.append(client)
                await client.connect()
            for h in more:
                await asyncio.to_thread(a.wait_sees, "scale-idle", h.host_id, timeout=_WAIT_S)
            await asyncio.sleep(_SETTLE_S)
            self.step(f"scale: {self.n} hosts up")
            if idle:
                await self._idle()
                self.out["memory"] = _memory([a, b, *more])
                await self._ring([a, b, *more], crowd)
                self.step(f"scale: {self.n} hosts idle counted, every host delivered")
            await self._p50(sender, b, key)
            self.step(f"scale: {self.n} hosts measured")
        finally:
            await asyncio.gather(*(c.close() for c in crowd), return_exceptions=True)
            await asyncio.to_thread(self._stop, more)

    async def _idle(self) -> None:
        """Commits per idle relay per second over the quiet windows (the median of the
        windows' rates), what ran in them (with pg_stat_statements) and each host's backends."""
        counters = StoreCounters(self.conninfo)
        windows: list[dict[str, Any]] = []
        try:
            # The hosts' start-up work is published before the window opens (FLUSH_S).
            await asyncio.sleep(FLUSH_S)
            mark = counters.reads
            calls0 = counters.calls()
            t_all = time.monotonic()
            for _ in range(self.windows):
                vacuums0, sessions0 = counters.vacuums(), counters.sessions()
                c0, _ = counters.read()
                # The bench's reads since the last window's count are published in this one.
                own = counters.reads - mark
                t0 = time.monotonic()
                await asyncio.sleep(self.quiet_s)
                mark = counters.reads
                c1, _ = counters.read()
                seconds = time.monotonic() - t0
                commits = max(0, c1 - c0 - own)
                windows.append(
                    {
                        "seconds": round(seconds, 2),
                        "commits": commits,
                        "commits_per_s_per_relay": commits / self.n / seconds,
                        # The server's own: autovacuum and autoanalyze runs finished in it.
                        "autovacuum_runs": counters.vacuums() - vacuums0,
                        "sessions_opened": counters.sessions() - sessions0,
                    }
                )
            seconds = time.monotonic() - t_all
            calls1 = counters.calls()
        finally:
            counters.close()
        ran = {q: n - calls0.get(q, 0) for q, n in calls1.items() if n > calls0.get(q, 0)}
        top = sorted(ran.items(), key=lambda qn: -qn[1])[:_TOP_STATEMENTS]
        backends = await asyncio.to_thread(Backends(self.conninfo, self.ids).once)
        server = await asyncio.to_thread(_server_connections, self.conninfo)
        self.out["idle"] = {
            "server_max_connections": server[0],
            "server_backends": server[1],
            "relays": self.n,
            "seconds": sum(w["seconds"] for w in windows),
            "commits": sum(w["commits"] for w in windows),
            "commits_per_s_per_relay": statistics.median(
                w["commits_per_s_per_relay"] for w in windows
            ),
            "windows": windows,
            "autovacuum_runs": sum(w["autovacuum_runs"] for w in windows),
            "sessions_opened": sum(w["sessions_opened"] for w in windows),
            "statements_per_s_per_relay_all": round(sum(ran.values()) / self.n / seconds, 2),
            # Calls per second per relay of each statement, most first (the bench's own too).
            "statements_per_s_per_relay": [
                (round(n / self.n / seconds, 2), q[:_STATEMENT_CHARS]) for q, n in top
            ],
            "connections": backends.most,
            "connections_by_role": backends.roles,
        }

    async def _ring(self, hosts: list[SimHost], crowd: list[AsyncClient]) -> None:
        """Every host sends one message to the next host's session (host 0's sender and host
        1's sink included): how many came back delivered, and the slowest."""
        # Who each host has: host 0 the sender, host 1 the sink, the others an idle session.
        targets = ["scale-sender", "sink0", *("scale-idle" for _ in hosts[2:])]
        senders: list[AsyncClient | None] = [None, None, *crowd]  # 0 and 1: made here

        async def one(k: int) -> tuple[str, float]:
            host, nxt = hosts[k], hosts[(k + 1) % len(hosts)]
            client = senders[k]
            own = client is None
            if client is None:
                client = AsyncClient(host.settings, host.identity(f"ring-{k}", cwd="/"))
                await client.connect()
            try:
                t0 = time.perf_counter()
                r = await client.send(f"{targets[(k + 1) % len(hosts)]}@{nxt.host_id}", "ring")
                said = r.outcome.value + (f" ({r.code})" if r.code else "")
                return said, time.perf_counter() - t0
            finally:
                if own:
                    await client.close()

        got = await asyncio.gather(*(one(k) for k in range(len(hosts))))
        outcomes: dict[str, int] = {}
        for outcome, _ in got:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        self.out["ring"] = {
            "hosts": len(hosts),
            "outcomes": outcomes,
            "delivered": outcomes.get("delivered", 0),
            "slowest_ms": round(max(s for _, s in got) * 1000, 1),
        }

    def _start(self, host_ids: list[str]) -> list[SimHost]:
        hosts = [self.cluster.host(h, relay=False) for h in host_ids]
        # A batch at a time: a hundred interpreters starting at once on a small machine keep
        # a relay's broker from answering within its spawn timeout.
        for i in range(0, len(hosts), _START_BATCH):
            batch = hosts[i : i + _START_BATCH]
            for h in batch:
                h.configure(**BULK_SENDER)
                h.start_relay(wait=False)
            for h in batch:
                h.wait_relay(_WAIT_S)
        return hosts

    def _stop(self, hosts: list[SimHost]) -> None:
        for h in hosts:
            h.begin_stop()
        for h in hosts:
            h.stop()
            self.cluster.hosts.remove(h)  # stopped once: its broker pid is not signalled again

    def figures(self) -> tuple[list[Figure], dict[str, Any]]:
        """The many-hosts figures and their raw numbers (``details.scale.hosts``)."""
        out = self.run()
        hosts, sends = self.n, self.sends
        manys = [out[k]["delivered_p50_ms"] for k in self.manys]
        twos = [out[k]["delivered_p50_ms"] for k in self.twos]
        # Each many-host run beside the two-host runs just before and just after it.
        ratios = [m / t for k, m in enumerate(manys) for t in twos[k : k + 2] if t > 0]
        seen = [out["idle"]["connections"]]
        seen += [out[k]["busy_connections"] for k in self.twos + self.manys]
        busiest = max(n for per_host in seen for n in per_host.values())
        out["connections_per_host_max"] = busiest
        path = f"scale {hosts} hosts"
        figures = [
            Figure(
                path,
                "delivered p50",
                "ms",
                statistics.median(manys),
                statistics.median(twos),
                f"the same 2 hosts alone on the database, alternated: before, between and after "
                f"two runs with the others ({sends} sequential sends each)",
                False,
                LATENCY_TARGET,
                pairing="round trip",
                ratios=ratios,
            ),
            Figure(
                path,
                "hosts delivered (ring)",
                "hosts",
                out["ring"]["delivered"],
                hosts,
                "every host: each sends one message to the next host's session, all at once",
                True,
                1.0,
                pairing="ceiling",
            ),
            Figure(
                path,
                "idle commits/s per relay",
                "commits/s",
                out["idle"]["commits_per_s_per_relay"],
                IDLE_COMMITS_CEILING,
                "the ceiling: 0.2 commits/s per idle relay, one heartbeat per lease_s / 3 "
                "(pg_stat_database.xact_commit)",
                False,
                1.0,
                pairing="ceiling",
            ),
            Figure(
                path,
                "connections per host",
                "connections",
                busiest,
                CONNECTIONS_CEILING,
                "the ceiling: 1 database connection per host, the most on any host idle or busy "
                "(pg_stat_activity by application_name)",
                False,
                1.0,
                pairing="ceiling",
            ),
        ]
        return figures, out


def _rss_kib(pid: int | None) -> int | None:
    """A process's resident set (``VmRSS``), KiB; None when it is gone."""
    if pid is None:
        return None
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith("VmRSS:")), None)


def _memory(hosts: list[SimHost]) -> dict[str, Any]:
    """Each host's relay and broker resident sets: median and most, MiB."""
    out: dict[str, Any] = {}
    for what, pids in (
        ("relay", [h.relay.pid if h.relay is not None else None for h in hosts]),
        ("broker", [h.broker_pid() for h in hosts]),
    ):
        kib = [k for k in map(_rss_kib, pids) if k is not None]
        if kib:
            out[f"{what}_rss_mib_median"] = round(statistics.median(kib) / 1024, 1)
            out[f"{what}_rss_mib_max"] = round(max(kib) / 1024, 1)
    return out


def _server_connections(conninfo: str) -> tuple[int, int]:
    """The server's ``max_connections`` and its client backends now, every database's."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int, "
            "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])
