"""`crossintercom bench --quick` and `crossintercom chaos` on both backends, through the CLI.

The benchmark is checked for shape only (every figure present and positive); its speed targets
are reported by the command itself, never asserted here. Chaos must report nothing lost and
nothing duplicated.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from crossintercom.tools.harness import CLI  # noqa: E402
from tests.conftest import pids_using_home  # noqa: E402
from tests.pgharness import (  # noqa: E402, F401  (fixtures are found by name)
    PgServer,
    pg_empty_url,
    pg_server,
)
from tests.soak import clean_env  # noqa: E402

FIGURES = {
    ("same-host", "send latency p50"),
    ("same-host", "send latency p99"),
    ("same-host", "throughput"),
    ("cross-host", "send latency p50"),
    ("cross-host", "send latency p99"),
    ("cross-host", "throughput"),
}


def run_cli(args: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    # TMPDIR: whatever the command leaves behind would show up there
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(TMPDIR=str(tmp_path)),
        check=False,
    )


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short TMPDIR for the command: its runtime dirs hold AF_UNIX sockets (107 bytes max)."""
    path = Path(tempfile.mkdtemp(prefix="cibc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.pg)])
def store_args(request: pytest.FixtureRequest) -> list[str]:
    if request.param == "sqlite":
        return []
    # An empty database: the commands must create the schema themselves.
    url: str = request.getfixturevalue("pg_empty_url")
    return ["--store", url]


def leftovers(tmp_path: Path) -> list[int]:
    """Processes still running with a runtime dir under ``tmp_path`` (there must be none)."""
    return pids_using_home(tmp_path)


def check_bench(report: dict[str, Any], backend: str) -> None:
    assert report["backend"] == backend
    assert report["quick"] is True
    figures = {(f["path"], f["metric"]): f for f in report["figures"]}
    assert set(figures) == FIGURES
    for f in figures.values():
        assert f["crossintercom"] > 0, f
        assert f["baseline"] > 0, f
        assert f["ratio"] > 0, f
        assert f["baseline_is"]
    cross = [f for (path, _), f in figures.items() if path == "cross-host"]
    targets = {f["metric"]: (f["target"], f["target_met"]) for f in cross}
    if backend == "postgres":
        assert targets["send latency p50"][0] == 1.5
        assert targets["throughput"][0] == 0.8
        assert all(isinstance(met, bool) for t, met in targets.values() if t is not None)
    else:
        assert all(t is None for t, _ in targets.values())
    # Every message of every phase came back with an acknowledged outcome.
    for phase, outcomes in report["details"]["outcomes"].items():
        assert set(outcomes) <= {"delivered", "queued"}, (phase, outcomes)


def check_chart(page: str) -> None:
    """The chart beside the table: a latency curve per series, a bar per throughput."""
    for series in (
        "crossintercom same-host",
        "raw Unix-socket echo",
        "crossintercom cross-host",
        "raw store round trip",
    ):
        [curve] = re.findall(rf'data-series="{series}" points="([^"]+)"', page)
        assert len(curve.split()) >= 10, series  # one point per sample
    for bar in ("same-host crossintercom", "cross-host raw baseline"):
        [width] = re.findall(rf'data-bar="{bar}" x="\d+" y="[\d.]+" width="([\d.]+)"', page)
        assert float(width) > 0, bar
    assert "<script" not in page


def test_bench_quick_json(store_args: list[str], short_tmp: Path, tmp_path: Path) -> None:
    chart = tmp_path / "bench.html"
    args = ["bench", "--quick", "--json", "--chart", str(chart), *store_args]
    proc = run_cli(args, short_tmp, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    check_bench(json.loads(proc.stdout), "postgres" if store_args else "sqlite")
    check_chart(chart.read_text())
    assert list(short_tmp.iterdir()) == []  # temporary dirs removed
    assert leftovers(short_tmp) == []


def test_chaos_loses_and_duplicates_nothing(store_args: list[str], short_tmp: Path) -> None:
    args = ["chaos", "--hosts", "3", "--duration", "15", "--seed", "1", "--json", *store_args]
    proc = run_cli(args, short_tmp, timeout=170)
    report = json.loads(proc.stdout)
    assert report["attempted"] > 0
    assert report["acknowledged"] > 0
    assert report["lost"] == 0, report
    assert report["duplicated"] == 0, report
    assert sum(report["faults"].values()) > 0
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(short_tmp.iterdir()) == []
    assert leftovers(short_tmp) == []
