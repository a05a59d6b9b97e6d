"""One benchmark run: the raw far ends, the clusters, the figures and the machine facts.

The cross-host paths run on a temporary SQLite file always, and on PostgreSQL when ``--store``
names one (a ``sqlite:///`` store replaces the temporary file). Same-host figures are measured
in the first cluster (PostgreSQL when there is one). See docs/performance.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import secrets
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from crossintercom.config import ENV_HOME
from crossintercom.tools.bench.baselines import RawPostgres, RawSQLite, RawUDS
from crossintercom.tools.bench.peer import PEER, Peer, missing
from crossintercom.tools.bench.report import BenchReport, Figure, median
from crossintercom.tools.bench.rounds import ClusterBench, Rounds
from crossintercom.tools.bench.workload import Counts
from crossintercom.tools.common import Store, prepare_store, scratch_dir, utc_now
from crossintercom.tools.harness import CLI

UDS_ONE_WAY = "raw Unix socket: bench -> forwarder process -> sink process, one frame at a time"
UDS_ECHO = "raw Unix socket: bench -> echo process -> bench, one frame at a time"
UDS_PIPE = "raw Unix socket: 4 clients pipelining 16 frames each through the echo process"
RAW = {
    "postgres": {
        "one_way": "INSERT + NOTIFY in one transaction, until a LISTEN process sees it",
        "round_trip": "INSERT request + NOTIFY; a responder process claims it, inserts the "
        "reply and NOTIFYs back in one statement; until the bench's LISTEN sees it",
        "rate": "batched INSERT (500 rows) + SELECT ... FOR UPDATE SKIP LOCKED + UPDATE, rows/s",
    },
    "sqlite": {
        "one_way": "INSERT in BEGIN IMMEDIATE + doorbell file, until a watchdog process sees it",
        "round_trip": "INSERT request + doorbell; a watchdog responder process claims it and "
        "inserts the reply in one transaction and rings back; until a watchdog process sees it",
        "rate": "one-row write transactions (BEGIN IMMEDIATE, INSERT, COMMIT) per second",
    },
}
# The store issue's targets (issue 9's where it set none): crossintercom / raw at most
# (latency) or at least (rates); docs/performance.md, "Where each target stands".
TARGETS = {
    "same_one_way_p50": 2.0,
    "same_delivered_p50": 2.0,
    "same_throughput": 0.3,
    ("postgres", "cross_one_way_p50"): 2.5,
    ("postgres", "cross_delivered_p50"): 3.0,
    ("postgres", "cross_throughput"): 0.25,
    ("postgres", "catch_up"): 0.5,
    ("sqlite", "cross_one_way_p50"): 2.5,
    ("sqlite", "cross_throughput"): 3.0,
}
# Ceilings per delivered PostgreSQL message, figures of their own (``_store_work_figures``).
STORE_WORK_TARGETS = {"statements_per_message": 3, "commits_per_message": 3}
# CPU per delivered cross-host message, summed over every process and the store's backends.
CPU_CEILING_MS = 0.5
CPU_IS = (
    f"the design's ceiling: {CPU_CEILING_MS} ms of CPU per delivered cross-host message, summed "
    "over senders, brokers, relays, listeners and the store's backends (/proc utime + stime)"
)
PEER_IS = {
    "cross_one_way_p50": "PgQueuer (psycopg, a consumer process with its defaults): one job at "
    "a time, enqueue until its handler starts",
    "cross_throughput": "PgQueuer: as many producers as senders, each enqueueing the window's "
    "jobs per call, until the consumer has started them all",
    "catch_up": "PgQueuer: a backlog of the same size enqueued with no consumer, from starting "
    "the consumer until it has started them all",
    "cpu": "PgQueuer: its consumer process, the producers' thread and its database's backends",
}
# Targets against the peer, as ratios crossintercom / PgQueuer (median of the rounds' ratios).
PEER_TARGETS = {"cross_one_way_p50": 1.0, "cross_throughput": 1.5, "catch_up": 2.0}
NO_PEER_STORE = (
    "the peer phase runs on PostgreSQL only: give --store postgresql://... or --own-postgres"
)
HOSTS_STEPS = 8  # the progress bar's steps in bench.hosts


@contextlib.contextmanager
def _progress(enabled: bool, total: int, took: dict[str, float]) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr (stdout stays one JSON object with ``--json``)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not enabled,
    ) as bar:
        task = bar.add_task("bench: starting", total=total)
        last = [time.perf_counter()]

        def step(what: str) -> None:
            now = time.perf_counter()
            took[what] = round(now - last[0], 1)
            last[0] = now
            bar.update(task, advance=1, description=f"bench: {what}")

        yield step


def _figures(kind: str, rounds: Rounds, same_host: bool) -> list[Figure]:
    """The figures of one cluster, each from its rounds' (crossintercom, raw) values."""

    def peer(key: str) -> dict[str, Any]:
        pairs = rounds.peer.get(key)
        if not pairs:
            return {}
        return {
            "peer": median([p for _, p in pairs]),
            "peer_ratios": [ci / p for ci, p in pairs if p > 0],
            "peer_is": PEER_IS[key],
            "peer_target": PEER_TARGETS.get(key),
        }

    def fig(key: str, path: str, metric: str, unit: str, is_: str, pairing: str) -> Figure:
        pairs = rounds.values[key]
        higher = unit == "msg/s"
        return Figure(
            path,
            metric,
            unit,
            median([ci for ci, _ in pairs]),
            median([raw for _, raw in pairs]),
            is_,
            higher,
            TARGETS.get(key if same_host and key.startswith(("same", "full")) else (kind, key)),
            pairing=pairing,
            ratios=[ci / raw for ci, raw in pairs if raw > 0],
            **peer(key),
        )

    out: list[Figure] = []
    if same_host:
        out += [
            fig("same_one_way_p50", "same-host", "one-way p50", "ms", UDS_ONE_WAY, "one-way"),
            fig("same_delivered_p50", "same-host", "delivered p50", "ms", UDS_ECHO, "round trip"),
            fig("same_delivered_p99", "same-host", "delivered p99", "ms", UDS_ECHO, "round trip"),
            fig("same_throughput", "same-host", "throughput", "msg/s", UDS_PIPE, "throughput"),
            fig("full_one_way_p50", "same-host full", "one-way p50", "ms", UDS_ONE_WAY, "one-way"),
            fig(
                "full_delivered_p50",
                "same-host full",
                "delivered p50",
                "ms",
                UDS_ECHO,
                "round trip",
            ),
        ]
    raw, path = RAW[kind], f"cross-host {kind}"
    out += [
        fig("cross_one_way_p50", path, "one-way p50", "ms", raw["one_way"], "one-way"),
        fig("cross_delivered_p50", path, "delivered p50", "ms", raw["round_trip"], "round trip"),
        fig("cross_delivered_p99", path, "delivered p99", "ms", raw["round_trip"], "round trip"),
        fig("ask_reply_p50", path, "ask -> reply p50", "ms", raw["round_trip"], "round trip"),
        fig("cross_throughput", path, "throughput", "msg/s", raw["rate"], "throughput"),
    ]
    rates = [r for _, r in rounds.values["cross_throughput"]]
    out.append(
        Figure(
            path,
            "backlog catch-up",
            "msg/s",
            median(rounds.drains),
            median(rates),
            raw["rate"],
            True,
            TARGETS.get((kind, "catch_up")),
            pairing="throughput",
            **peer("catch_up"),
        )
    )
    for phase in ("throughput", "sequential"):
        ours = [c["total"] for c in rounds.cpu[phase]]
        theirs = [c["total"] for c in rounds.cpu.get(f"peer {phase}", [])]
        extra: dict[str, Any] = {}
        if theirs:
            extra = {
                "peer": median(theirs),
                "peer_ratios": [a / b for a, b in zip(ours, theirs, strict=False) if b > 0],
                "peer_is": PEER_IS["cpu"],
            }
        out.append(
            Figure(
                path,
                f"CPU per message, {phase}",
                "ms",
                median(ours),
                CPU_CEILING_MS,
                CPU_IS,
                False,
                1.0,
                pairing="ceiling",
                **extra,
            )
        )
    return out


def cpu_details(rounds: Rounds) -> dict[str, dict[str, float]]:
    """Per phase, the median over the rounds of each role's CPU ms per message."""
    out = {}
    for phase, samples in rounds.cpu.items():
        roles = {r for s in samples for r in s}
        out[phase] = {r: round(median([s.get(r, 0.0) for s in samples]), 3) for r in sorted(roles)}
    return out


def _store_work_figures(work: dict[str, Any]) -> list[Figure]:
    """Statements (when the server counts them) and commits per delivered message, each
    beside its ceiling as a ``ceiling`` figure (target 1.0x of it)."""
    out = []
    for key, metric in (
        ("statements_per_message", "statements per message"),
        ("commits_per_message", "commits per message"),
    ):
        if work.get(key) is None:
            continue
        ceiling = STORE_WORK_TARGETS[key]
        out.append(
            Figure(
                "cross-host postgres",
                metric,
                metric.split()[0],
                work[key],
                ceiling,
                f"the store issue's ceiling: {ceiling} per delivered message "
                "(pg_stat_statements calls / pg_stat_database.xact_commit, less idle)",
                False,
                1.0,
                pairing="ceiling",
            )
        )
    return out


def _bytecode_cached() -> bool:
    """Whether the relay's modules have ``.pyc`` files: without (an editable checkout under
    ``PYTHONDONTWRITEBYTECODE``) every process the bench starts compiles them first, and the
    figures that include a start carry the compiler (docs/performance.md, "Byte code")."""
    specs = [importlib.util.find_spec(f"crossintercom.relay.{m}") for m in ("inbound", "service")]
    return all(s is not None and s.cached is not None and Path(s.cached).exists() for s in specs)


def _machine(conninfo: str | None) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "durability": {"same-host": "normal", "same-host full": "full"},
        "bytecode_cached": _bytecode_cached(),
        "note": "a shared machine: absolute figures are noisy; the ratios against baselines "
        "measured in the same run are what count",
    }
    if conninfo is not None:
        import psycopg

        with psycopg.connect(conninfo, autocommit=True) as conn:
            for name in ("server_version", "synchronous_commit"):
                row = conn.execute(f"SHOW {name}").fetchone()
                facts[f"postgres_{name}"] = row[0] if row else None
    return facts


@contextlib.contextmanager
def _peer(kind: str, conninfo: str | None, details: dict[str, Any]) -> Iterator[Peer | None]:
    """The peer on the PostgreSQL store's server when it is installed, else None."""
    if kind != "postgres" or conninfo is None or missing() is not None:
        yield None
        return
    with Peer(conninfo) as peer:
        details["peer"] = {
            "name": PEER,
            "version": peer.version,
            "database": "a throwaway database of its own on the store's server, dropped after",
        }
        yield peer


# The MCP server's tool profiles (agents/mcp/profiles.py; the tools do not import the agents).
MCP_PROFILES = ("core", "coord", "supervisor", "all")


def _tools_list_bytes(root: Path) -> dict[str, int | str]:
    """What joining costs a model on every request: each MCP tool profile's tools/list, in
    bytes of JSON, as `crossintercom mcp --print-tools` prints it."""
    sizes: dict[str, int | str] = {}
    env = {**os.environ, ENV_HOME: str(root / "mcp")}
    for profile in MCP_PROFILES:
        out = subprocess.run(
            [*CLI, "mcp", "--as", "bench", "--profile", profile, "--print-tools"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        sizes[profile] = len(out.stdout.strip().encode()) if out.returncode == 0 else "n/a"
    return sizes


def run_bench(
    store_url: str | None = None,
    *,
    quick: bool = False,
    progress: bool = True,
    scale: bool = False,
    own_postgres: bool = False,
    polling: bool = False,
    hosts: int | None = None,
    metrics: bool = False,
) -> BenchReport:
    """Every figure; with ``scale`` also one broker with many sessions (``bench.scale``) and,
    on PostgreSQL, many hosts on the one database (``bench.hosts``); with ``polling`` the
    SQLite one-way latency when the relays poll their doorbells (``bench.polling``).

    ``own_postgres``: the PostgreSQL store is a throwaway cluster started for this run, with
    ``pg_stat_statements`` loaded so statements per message are counted by the server, and
    fsync on like a real server's (docs/performance.md). ``metrics``: the cross-host relays
    serve their metrics and are scraped every second while they are measured.

    ``hosts``: only the many hosts on one PostgreSQL server, that many of them, once
    (``bench --scale --hosts N``; docs/operations.md, "Sizing")."""
    if own_postgres:
        if store_url is not None:
            raise ValueError("--own-postgres starts its own store; leave out --store")
        from crossintercom.tools.pgcluster import ThrowawayPostgres

        settings = {"shared_preload_libraries": "pg_stat_statements"}
        with ThrowawayPostgres(fsync=True, server_settings=settings) as server:
            report = run_bench(
                server.url,
                quick=quick,
                progress=progress,
                scale=scale,
                polling=polling,
                hosts=hosts,
                metrics=metrics,
            )
        report.machine["postgres_throwaway"] = True
        return report
    counts = Counts.for_run(quick)
    started = time.perf_counter()
    token = secrets.token_hex(2)
    if hosts is not None:
        return _fleet(store_url, hosts, counts, progress, started, token)
    with scratch_dir("ci-bench-") as root:
        stores: list[Store] = []
        if store_url is not None and store_url.startswith("postgresql"):
            stores.append(prepare_store(store_url, root))
            stores.append(prepare_store(None, root))
        else:
            stores.append(prepare_store(store_url, root))
        conninfo = next((s.parsed.libpq_conninfo() for s in stores if s.kind == "postgres"), None)
        report = BenchReport(
            backend=stores[0].kind,
            store=stores[0].label,
            quick=quick,
            date=utc_now(),
            counts={k: v for k, v in asdict(counts).items() if isinstance(v, int)},
            machine=_machine(conninfo),
            backends=[s.kind for s in stores],
        )
        steps = sum(counts.repeats + 3 + (s.kind == "postgres") for s in stores)
        steps += scale * (1 + HOSTS_STEPS * (conninfo is not None)) + polling
        details: dict[str, Any] = {"outcomes": {}, "step_s": {}, "cpu_ms_per_message": {}}
        details["peer"] = NO_PEER_STORE if conninfo is None else missing() or {"name": PEER}
        with _progress(progress, steps, details["step_s"]) as step, RawUDS(root) as uds:
            for k, store in enumerate(stores):
                bench = ClusterBench(root / store.kind, store.url, store.kind, counts, step, token)
                bench.metrics = metrics
                (root / store.kind).mkdir()
                raw: RawPostgres | RawSQLite
                if store.kind == "postgres":
                    assert conninfo is not None
                    raw = RawPostgres(conninfo)
                else:
                    path = store.parsed.path
                    assert path is not None
                    # A file of its own beside the store: the raw table never touches the mailbox.
                    raw = RawSQLite(path.with_name(f"{path.name}.bench-raw-{os.getpid()}"))
                with raw, _peer(store.kind, conninfo, details) as peer:
                    step(f"{store.kind} raw baselines ready")
                    rounds = bench.run(
                        uds if k == 0 else None,
                        raw,
                        conninfo if store.kind == "postgres" else None,
                        peer,
                    )
                details["cpu_ms_per_message"][store.kind] = cpu_details(rounds)
                if metrics:
                    details.setdefault("metrics_scrapes", {})[store.kind] = bench.scrapes
                report.figures += _figures(store.kind, rounds, same_host=k == 0)
                if k == 0:  # the chart's curves: same-host, and the first store's cross-host
                    for name, key in (("same-host", "same"), ("cross-host", "cross")):
                        report.latency_ms[name] = rounds.samples[key]
                        report.latency_ms[f"{name} raw"] = rounds.samples[f"{key} raw"]
                details["outcomes"][store.kind] = {p: dict(c) for p, c in rounds.outcomes.items()}
                if polling and store.kind == "sqlite":
                    from crossintercom.tools.bench.polling import polling_figure, polling_sends

                    (root / "polling").mkdir()
                    samples = polling_sends(
                        root / "polling", store.url, counts.latency, counts.warm_up, token
                    ).one_way
                    inotify = median([ci for ci, _ in rounds.values["cross_one_way_p50"]])
                    report.figures.append(polling_figure(samples, inotify))
                    step("sqlite polling")
                if rounds.store_work is not None:
                    details["store_work"] = {**rounds.store_work, "targets": STORE_WORK_TARGETS}
                    report.figures += _store_work_figures(rounds.store_work)
            if scale:
                from crossintercom.tools.bench.scale import scale_figures

                (root / "scale").mkdir()
                figures, details["scale"] = scale_figures(
                    root / "scale",
                    stores[-1].url,
                    sessions=counts.scale_sessions,
                    sends=counts.latency,
                )
                report.figures += figures
                step("scale")
                if conninfo is not None:  # and many hosts on the PostgreSQL store
                    from crossintercom.tools.bench.hosts import HostsBench

                    (root / "hosts").mkdir()
                    figures, details["scale"]["hosts"] = HostsBench(
                        root / "hosts",
                        stores[0].url,
                        conninfo,
                        hosts=counts.scale_hosts,
                        sends=counts.latency,
                        quiet_s=counts.scale_quiet_s,
                        windows=counts.scale_quiet_windows,
                        token=token,
                        step=step,
                    ).figures()
                    report.figures += figures
            details["mcp_tools_list_bytes"] = _tools_list_bytes(root)
        report.details = details
    report.elapsed_s = round(time.perf_counter() - started, 1)
    return report


def _fleet(
    store_url: str | None, hosts: int, counts: Counts, progress: bool, started: float, token: str
) -> BenchReport:
    """``bench --scale --hosts N``: N hosts on one PostgreSQL server and nothing else."""
    from crossintercom.tools.bench.hosts import HostsBench

    if store_url is None or not store_url.startswith("postgresql"):
        raise ValueError(
            "--hosts needs PostgreSQL: give --store postgresql://... or --own-postgres"
        )
    with scratch_dir("ci-bench-") as root:
        store = prepare_store(store_url, root)
        conninfo = store.parsed.libpq_conninfo()
        report = BenchReport(
            backend=store.kind,
            store=store.label,
            quick=False,
            date=utc_now(),
            counts={"hosts": hosts, "sends": counts.latency},
            machine=_machine(conninfo),
            backends=[store.kind],
        )
        details: dict[str, Any] = {"step_s": {}}
        (root / "hosts").mkdir()
        with _progress(progress, HOSTS_STEPS, details["step_s"]) as step:
            report.figures, details["hosts"] = HostsBench(
                root / "hosts",
                store.url,
                conninfo,
                hosts=hosts,
                sends=counts.latency,
                quiet_s=counts.scale_quiet_s,
                windows=counts.scale_quiet_windows,
                token=token,
                step=step,
                rounds=1,
            ).figures()
        report.details = details
    report.elapsed_s = round(time.perf_counter() - started, 1)
    return report
