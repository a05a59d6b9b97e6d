"""`crossintercom bench`: latency and throughput of every path beside raw baselines.

Each crossintercom figure is measured in the same run, on the same machine, as a raw baseline
that does the least work the path could possibly do:

* same-host send (sender -> broker -> live listener, ``delivered``) vs. a length-prefixed JSON
  frame echoed over a Unix socket by a tiny server thread of our own;
* cross-host send over the store (two simulated hosts, each its own broker + relay; a sender on
  alpha, listeners on beta, ``delivered``) vs. a bare INSERT + NOTIFY seen by a LISTEN connection
  (PostgreSQL), or an INSERT + doorbell file seen by a watchdog observer (SQLite);
* throughput of both, with several senders and many messages in flight, vs. raw frames/s over a
  socket and batched insert + claim (``FOR UPDATE SKIP LOCKED`` on PostgreSQL) rows/s.

The ratio targets of the project (cross-host PostgreSQL: latency p50 within 1.5x, throughput at
least 0.8x of raw) are reported as met / not met; nothing here asserts them. Everything the
benchmark starts (relays, brokers, listeners, threads, temporary files, its own raw table) is
stopped or removed before it returns. Run it against a scratch database: it registers two hosts
(``bench-alpha-*``, ``bench-beta-*``) and their sessions in the store.
"""

from crossintercom.tools.bench.chart import write_chart
from crossintercom.tools.bench.report import BenchReport, render
from crossintercom.tools.bench.run import run_bench

__all__ = ["BenchReport", "render", "run_bench", "write_chart"]
