"""The bench's peer columns and its skip line, and CPU read from /proc, in process.

The peer's phase itself runs in tests/test_bench_chaos.py (``bench --quick --json`` on
PostgreSQL, PgQueuer from the test extra)."""

from __future__ import annotations

import importlib.util
import os
import time

import pytest

from crossintercom.tools.bench import peer, render
from crossintercom.tools.bench.cpu import CpuAccount, process_cpu
from crossintercom.tools.bench.report import BenchReport, Figure


def test_without_pgqueuer_the_peer_is_skipped_saying_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "pgqueuer" else real(name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    why = peer.missing()
    assert why is not None and "pip install 'crossintercom[bench]'" in why
    report = BenchReport("postgres", "pg", True, "now", {}, details={"peer": why})
    throughput = Figure("cross-host postgres", "throughput", "msg/s", 10, 100, "raw", True)
    report.figures.append(throughput)
    render(report)
    out = capsys.readouterr().out
    assert "crossintercom[bench]" in out
    assert "ratio to peer" not in out  # no peer column without a peer figure


def test_peer_figures_carry_the_median_ratio_beside_the_raw_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the table's headers on one line each
    f = Figure(
        "cross-host postgres",
        "throughput",
        "msg/s",
        900.0,
        9000.0,
        "raw",
        True,
        ratios=[0.1, 0.1, 0.1],
        peer=1000.0,
        peer_ratios=[0.8, 0.9, 1.2],
        peer_is="PgQueuer",
        peer_target=1.5,
    )
    assert f.ratio == pytest.approx(0.1) and f.peer_ratio == pytest.approx(0.9)
    assert f.peer_target_met is False  # 0.9x of the peer's rate against >= 1.5x
    report = BenchReport("postgres", "pg", True, "now", {}, figures=[f])
    assert report.to_dict()["figures"][0]["peer_ratio"] == pytest.approx(0.9)
    assert report.to_dict()["figures"][0]["peer_target_met"] is False
    render(report)
    out = capsys.readouterr().out
    assert "ratio to peer" in out and "0.90x" in out and "peer (cross-host postgres" in out
    assert "peer target" in out and ">=1.5x NOT met" in out
    # Lower is better for a latency: 0.8x of the peer's time meets <= 1.0x.
    latency = Figure(
        "p",
        "one-way p50",
        "ms",
        4.0,
        1.0,
        "raw",
        False,
        peer=5.0,
        peer_ratios=[0.8],
        peer_target=1.0,
    )
    assert latency.peer_target_met is True


def test_cpu_is_counted_for_the_processes_named_and_the_calling_thread() -> None:
    me = os.getpid()
    account = CpuAccount(lambda: {me: "relay"})
    account.start()
    burnt = process_cpu(me) or 0.0
    deadline = time.monotonic() + 30
    while (process_cpu(me) or 0.0) - burnt < 0.2 and time.monotonic() < deadline:
        sum(range(10_000))  # this thread works, and so this process
    used = account.stop(10)
    assert used["relay"] >= 20.0  # 0.2 s over 10 messages, in ms
    assert used["senders"] > 0
    assert used["total"] == pytest.approx(used["relay"] + used["senders"], abs=0.01)
