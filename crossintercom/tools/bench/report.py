"""The benchmark's figures: crossintercom beside its raw baseline, the ratio, the target.

Public (other outputs build on it): ``Figure``, ``BenchReport`` (``to_dict`` is the ``--json``
object), ``percentile``, ``median`` and ``render``. A figure's ``ratio`` is the median of the
per-round ratios in ``ratios`` (each round measures the raw baseline and the path back to back),
or crossintercom / baseline when there are none; ``crossintercom`` and ``baseline`` are the
medians of the rounds' values. A ``ceiling`` figure has no raw far end: its baseline is the
most issue 9 allows (commits/s per idle relay, connections per host) and its target 1.0x.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

PAIRINGS = ("one-way", "round trip", "throughput", "ceiling")


@dataclass
class Figure:
    path: str
    metric: str
    unit: str
    crossintercom: float
    baseline: float
    baseline_is: str
    higher_is_better: bool
    target: float | None = None
    ratio: float = 0.0
    target_met: bool | None = None
    pairing: str = ""  # one of PAIRINGS: like is paired with like
    ratios: list[float] = field(default_factory=list)
    # The peer (PgQueuer) measured in the same run, alternated: its value, and the median of
    # the per-round crossintercom / peer ratios (docs/performance.md, "The peer").
    peer: float | None = None
    peer_ratio: float | None = None
    peer_ratios: list[float] = field(default_factory=list)
    peer_is: str = ""
    # The target against the peer (``run.PEER_TARGETS``), met or not, as ``target`` for raw.
    peer_target: float | None = None
    peer_target_met: bool | None = None

    def __post_init__(self) -> None:
        if self.peer_ratios:
            self.peer_ratio = statistics.median(self.peer_ratios)
        if self.peer_target is not None and self.peer_ratio is not None:
            self.peer_target_met = _met(self.peer_ratio, self.peer_target, self.higher_is_better)
        if self.ratios:
            self.ratio = statistics.median(self.ratios)
        else:
            self.ratio = self.crossintercom / self.baseline if self.baseline > 0 else float("inf")
        if self.target is not None:
            self.target_met = _met(self.ratio, self.target, self.higher_is_better)


def _met(ratio: float, target: float, higher_is_better: bool) -> bool:
    return ratio >= target if higher_is_better else ratio <= target


def _target(target: float | None, met: bool | None, higher_is_better: bool) -> str:
    if target is None:
        return "-"
    return f"{'>=' if higher_is_better else '<='}{target}x {'met' if met else 'NOT met'}"


@dataclass
class BenchReport:
    backend: str
    store: str
    quick: bool
    date: str
    counts: dict[str, int]
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)
    backends: list[str] = field(default_factory=list)
    # Every latency sample (ms) by series, for the chart (``--chart``); not in the JSON.
    latency_ms: dict[str, list[float]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("latency_ms")
        return out


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def render(report: BenchReport) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"crossintercom bench ({', '.join(report.backends) or report.backend}; "
        f"{'quick' if report.quick else 'full'} run, {report.date})"
    )
    columns = ("path", "metric", "pairing", "crossintercom", "baseline", "ratio", "target")
    peer = any(f.peer is not None for f in report.figures)
    for col in (*columns, "peer", "ratio to peer", "peer target") if peer else columns:
        table.add_column(col, justify="left" if col in ("path", "metric", "pairing") else "right")
    for f in report.figures:
        fmt = "{:,.0f}" if f.unit == "msg/s" else "{:.2f}"
        row = [
            f.path,
            f"{f.metric} ({f.unit})",
            f.pairing,
            fmt.format(f.crossintercom),
            fmt.format(f.baseline),
            f"{f.ratio:.2f}x",
            _target(f.target, f.target_met, f.higher_is_better),
        ]
        if peer and f.peer is not None:
            row += [fmt.format(f.peer), f"{f.peer_ratio:.2f}x"]
            row.append(_target(f.peer_target, f.peer_target_met, f.higher_is_better))
        elif peer:
            row += ["-", "-", "-"]
        table.add_row(*row)
    console = Console()
    console.print(table)
    seen = set()
    for f in report.figures:
        if f.baseline_is not in seen:
            seen.add(f.baseline_is)
            console.print(f"  baseline ({f.path} {f.metric}): {f.baseline_is}")
    for f in report.figures:
        if f.peer_is:
            console.print(f"  peer ({f.path} {f.metric}): {f.peer_is}")
    for key, value in report.details.items():
        # Not markup: "pip install 'crossintercom[bench]'" would lose its "[bench]".
        console.print(f"  {key}: {value}", markup=False)
    console.print(f"  machine: {report.machine}")
    console.print(f"  took {report.elapsed_s} s; nothing left running")
