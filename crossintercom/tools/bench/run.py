"""One benchmark run: the store, the raw baselines, two simulated hosts, the figures."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from dataclasses import asdict

from crossintercom.tools.bench.baseline_store import raw_postgres, raw_sqlite
from crossintercom.tools.bench.baseline_uds import raw_uds
from crossintercom.tools.bench.paths import crossintercom_paths
from crossintercom.tools.bench.report import (
    LATENCY_TARGET,
    THROUGHPUT_TARGET,
    BenchReport,
    Figure,
    percentile,
)
from crossintercom.tools.bench.workload import Counts
from crossintercom.tools.common import prepare_store, scratch_dir, utc_now
from crossintercom.tools.harness import BULK_SENDER, Cluster, SimHost


def run_bench(store_url: str | None = None, *, quick: bool = False) -> BenchReport:
    counts = Counts.for_run(quick)
    started = time.perf_counter()
    with scratch_dir("ci-bench-") as root:
        store = prepare_store(store_url, root)
        report = BenchReport(
            backend=store.kind,
            store=store.label,
            quick=quick,
            date=utc_now(),
            counts={k: v for k, v in asdict(counts).items() if isinstance(v, int)},
        )
        uds_lat, uds_rate = raw_uds(root, counts)
        is_pg = store.kind == "postgres"
        if is_pg:
            db_lat, db_rate = raw_postgres(store.parsed.libpq_conninfo(), counts)
            db_lat_is = "INSERT + NOTIFY seen by a LISTEN connection"
            db_rate_is = "batched INSERT + SELECT ... FOR UPDATE SKIP LOCKED + UPDATE, rows/s"
        else:
            path = store.parsed.path
            assert path is not None
            # A file of its own beside the store: the raw table never touches the mailbox.
            raw_path = path.with_name(f"{path.name}.bench-raw-{os.getpid()}")
            db_lat, db_rate = raw_sqlite(raw_path, counts)
            db_lat_is = "INSERT + doorbell file seen by a watchdog observer"
            db_rate_is = "batched INSERT + claim by state + UPDATE, rows/s"

        token = secrets.token_hex(2)
        sinks = [f"sink{k}" for k in range(counts.receivers)]
        with Cluster(root, store.url, SimHost) as cluster:
            ids = (f"bench-alpha-{token}", f"bench-beta-{token}")
            alpha, beta = cluster.up(*ids, **dict.fromkeys(ids, BULK_SENDER))
            for host in (alpha, beta):
                for name in sinks:
                    host.listen(name)
            for name in sinks:
                for host in (alpha, beta):
                    alpha.wait_sees(name, host.host_id, timeout=60)
            ci = asyncio.run(crossintercom_paths(alpha, beta, counts, sinks))

        ms = 1000.0
        uds_is = "length-prefixed JSON frame echoed over a Unix socket (thread)"
        report.figures = [
            Figure("same-host", "send latency p50", "ms",
                   percentile(ci["same_latency"], 50) * ms, percentile(uds_lat, 50) * ms,
                   uds_is, False),
            Figure("same-host", "send latency p99", "ms",
                   percentile(ci["same_latency"], 99) * ms, percentile(uds_lat, 99) * ms,
                   uds_is, False),
            Figure("same-host", "throughput", "msg/s", ci["same_rate"], uds_rate,
                   f"{uds_is}, {counts.senders} pipelined clients", True),
            Figure("cross-host", "send latency p50", "ms",
                   percentile(ci["cross_latency"], 50) * ms, percentile(db_lat, 50) * ms,
                   db_lat_is, False, LATENCY_TARGET if is_pg else None),
            Figure("cross-host", "send latency p99", "ms",
                   percentile(ci["cross_latency"], 99) * ms, percentile(db_lat, 99) * ms,
                   db_lat_is, False),
            Figure("cross-host", "throughput", "msg/s", ci["cross_rate"], db_rate,
                   db_rate_is, True, THROUGHPUT_TARGET if is_pg else None),
        ]  # fmt: skip
        report.details = {
            "outcomes": ci["outcomes"],
            "cross_throughput_all_answered_s": ci["cross_throughput_all_answered_s"],
            "cpus": os.cpu_count(),
        }
    report.elapsed_s = round(time.perf_counter() - started, 1)
    return report
