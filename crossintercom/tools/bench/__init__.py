"""`crossintercom bench`: every delivery path beside a raw baseline measured in the same run.

Each raw baseline runs its far end in a process of its own (``rawproc``) and is measured in
rounds alternated with the crossintercom path it is paired with, like with like: one-way with
one-way, round trip with round trip, rate with rate (``baselines``, ``paths``, ``rounds``).
Figures are medians over the rounds, ratios the medians of the per-round ratios, reported
against issue 9's targets as met / not met; nothing here asserts them. Everything the benchmark
starts (relays, brokers, listeners, raw processes, temporary files, its own raw table) is stopped
or removed before it returns. Run it against a scratch database: it registers three hosts
(``bench-alpha-*``, ``bench-beta-*``, ``bench-gamma-*``) and their sessions in the store; the
per-sender rate limit is lifted on those hosts (bulk senders, not agents in a loop).
"""

from crossintercom.tools.bench.chart import write_chart
from crossintercom.tools.bench.report import BenchReport, render
from crossintercom.tools.bench.run import run_bench

__all__ = ["BenchReport", "render", "run_bench", "write_chart"]
