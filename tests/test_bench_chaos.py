"""`crossintercom bench --quick` and `crossintercom chaos` on both backends, through the CLI.

The benchmark is checked for shape only (every figure present and positive); its speed targets
are reported by the command itself, never asserted here. Chaos must report nothing lost and
nothing duplicated.
"""

from __future__ import annotations

import json
import os
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

from crossintercom.storage.urls import parse_store_url  # noqa: E402
from crossintercom.tools.chaos import ChaosReport, disk, fault_kinds  # noqa: E402
from crossintercom.tools.chaos.run import select_kinds as chaos_kinds  # noqa: E402
from crossintercom.tools.common import Store  # noqa: E402
from crossintercom.tools.harness import CLI  # noqa: E402
from crossintercom.tools.pgcluster import pg_bin  # noqa: E402
from tests.conftest import pids_using_home  # noqa: E402
from tests.pgharness import (  # noqa: E402, F401  (fixtures are found by name)
    PgServer,
    pg_empty_url,
    pg_server,
)
from tests.procs import clean_env  # noqa: E402

SAME_HOST = {
    ("same-host", "one-way p50"),
    ("same-host", "delivered p50"),
    ("same-host", "delivered p99"),
    ("same-host", "throughput"),
    ("same-host full", "one-way p50"),
    ("same-host full", "delivered p50"),
}
CROSS_METRICS = {
    "one-way p50",
    "delivered p50",
    "delivered p99",
    "ask -> reply p50",
    "throughput",
    "backlog catch-up",
}
# Like with like: each metric's pairing.
PAIRING = {
    "one-way p50": "one-way",
    "delivered p50": "round trip",
    "delivered p99": "round trip",
    "ask -> reply p50": "round trip",
    "throughput": "throughput",
    "backlog catch-up": "throughput",
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


SCALE = {("scale 200 sessions", "delivered p50"), ("scale 200 sessions", "list p50")}
# On PostgreSQL, --quick --scale also puts 6 hosts on the one database.
HOSTS = {
    ("scale 6 hosts", "delivered p50"),
    ("scale 6 hosts", "idle commits/s per relay"),
    ("scale 6 hosts", "connections per host"),
    ("scale 6 hosts", "hosts delivered (ring)"),
}
CPU = {"CPU per message, throughput", "CPU per message, sequential"}
# Beside the peer (PgQueuer, in the test extra) on PostgreSQL, measured in the same run.
PEER = {"one-way p50", "throughput", "backlog catch-up", *CPU}
CEILINGS = {
    *CPU,
    "idle commits/s per relay",
    "connections per host",
    "hosts delivered (ring)",
    "statements per message",
    "commits per message",
}
# Store work per delivered message, beside its ceiling; statements only where the server counts
# them (pg_stat_statements loaded).
STORE_WORK = {("cross-host postgres", "commits per message")}
STATEMENTS = ("cross-host postgres", "statements per message")


def check_bench(report: dict[str, Any], backends: list[str], scale: bool = False) -> None:
    assert report["backends"] == backends
    assert report["quick"] is True
    figures = {(f["path"], f["metric"]): f for f in report["figures"]}
    expected = SAME_HOST | {(f"cross-host {b}", m) for b in backends for m in CROSS_METRICS | CPU}
    check_cpu(report, backends)
    if "postgres" in backends:
        expected |= STORE_WORK
        check_peer(report, figures)
        if report["details"]["store_work"]["statements_per_message"] is not None:
            expected.add(STATEMENTS)
    if scale:
        expected |= SCALE
        details = report["details"]["scale"]
        assert details["sessions"] == 200
        assert details["many"]["broker_rss_kib"] > 0 and "rss_kib_per_session" in details
        if "postgres" in backends:
            expected |= HOSTS
            check_hosts(details["hosts"])
    assert set(figures) == expected
    for (_, metric), f in figures.items():
        if metric in CEILINGS:  # a count that may be 0, beside issue 9's ceiling
            assert f["pairing"] == "ceiling" and f["target"] == 1.0, f
            assert isinstance(f["crossintercom"], int | float) and f["crossintercom"] >= 0, f
            assert f["baseline"] > 0 and isinstance(f["target_met"], bool), f
            continue
        assert f["crossintercom"] > 0, f
        assert f["baseline"] > 0, f
        assert f["ratio"] > 0, f
        assert f["baseline_is"]
        assert f["pairing"] == PAIRING.get(metric, "round trip"), f
        assert f["target_met"] is None if f["target"] is None else isinstance(f["target_met"], bool)
    targets = {k: f["target"] for k, f in figures.items() if f["target"] is not None}
    assert targets[("same-host", "one-way p50")] == 2.0
    assert targets[("cross-host sqlite", "throughput")] == 3.0
    assert targets[("cross-host sqlite", "one-way p50")] == 2.5
    machine = report["machine"]
    assert machine["cpus"] >= 1 and machine["python"] and machine["durability"]
    assert isinstance(machine["bytecode_cached"], bool)
    if "postgres" in backends:
        assert targets[("cross-host postgres", "delivered p50")] == 3.0
        assert targets[("cross-host postgres", "one-way p50")] == 2.5
        assert targets[("cross-host postgres", "backlog catch-up")] == 0.5
        assert figures[("cross-host postgres", "commits per message")]["baseline"] == 3
        assert machine["postgres_server_version"] and machine["postgres_synchronous_commit"]
        work = report["details"]["store_work"]
        assert work["delivered"] == work["messages"] > 0
        assert work["commits_per_message"] >= 0
        assert work["statements_per_message"] is not None or work["statements_why"]
    # Every message of every phase came back with an acknowledged outcome (asks: a reply).
    for backend, phases in report["details"]["outcomes"].items():
        for phase, outcomes in phases.items():
            assert set(outcomes) <= {"delivered", "queued", "replied"}, (backend, phase)
    # What joining costs a model per request: each MCP tool profile's tools/list, in bytes.
    sizes = report["details"]["mcp_tools_list_bytes"]
    assert set(sizes) == {"core", "coord", "supervisor", "all"}, sizes
    assert sizes["core"] <= 6000 < sizes["all"], sizes


def check_cpu(report: dict[str, Any], backends: list[str]) -> None:
    """CPU per delivered cross-host message, by the processes on the path (and the server's
    backends on PostgreSQL: the test's server runs on this machine)."""
    for backend in backends:
        phases = report["details"]["cpu_ms_per_message"][backend]
        for phase in ("throughput", "sequential"):
            roles = {"senders", "broker", "relay", "listener", "total"}
            assert roles | ({"server"} if backend == "postgres" else set()) <= set(phases[phase])
            assert phases[phase]["total"] > 0, phases


def check_peer(report: dict[str, Any], figures: dict[tuple[str, str], Any]) -> None:
    """The peer's phase ran on the same server: its value and the ratio to it beside the raw
    baseline's, in the JSON."""
    assert report["details"]["peer"]["name"] == "PgQueuer", report["details"]["peer"]
    for (path, metric), f in figures.items():
        if path == "cross-host postgres" and metric in PEER:
            assert f["peer"] > 0 and f["peer_ratio"] > 0 and f["peer_is"], f
            assert len(f["peer_ratios"]) >= 1, f
            # The targets against the peer, judged in the run (whatever the quick run gives).
            if metric in ("one-way p50", "throughput", "backlog catch-up"):
                assert f["peer_target"] > 0 and isinstance(f["peer_target_met"], bool), f
        else:
            assert f["peer"] is None and f["peer_ratio"] is None, f
    assert set(report["details"]["cpu_ms_per_message"]["postgres"]) >= {
        "peer throughput",
        "peer sequential",
    }


def check_hosts(hosts: dict[str, Any]) -> None:
    """The raw numbers behind the many-hosts figures: every host's backends were found by the
    name its relay gives them, and every send came back delivered."""
    assert hosts["hosts"] == 6
    for phase in ("two", "many", "two_again", "many_again", "two_last"):
        assert hosts[phase]["delivered_p50_ms"] > 0
        assert set(hosts[phase]["outcomes"]) <= {"delivered", "queued"}
    for phase in ("many", "many_again"):
        assert len(hosts[phase]["busy_connections"]) == 6
        # The one pooled connection, its LISTEN on it.
        assert all(n >= 1 for n in hosts[phase]["busy_connections"].values())
    idle = hosts["idle"]
    assert idle["relays"] == 6 and idle["seconds"] >= 5 and idle["commits"] >= 0
    assert len(idle["connections"]) == 6 and all(n == 1 for n in idle["connections"].values())
    assert hosts["connections_per_host_max"] >= 1


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
    for bar in (
        "same-host throughput crossintercom",
        "cross-host sqlite throughput raw baseline",
    ):
        [width] = re.findall(rf'data-bar="{bar}" x="\d+" y="[\d.]+" width="([\d.]+)"', page)
        assert float(width) > 0, bar
    assert "<script" not in page


# On PostgreSQL the run includes the peer's phases too (a consumer process started twice).
@pytest.mark.timeout(360)
def test_bench_quick_json(store_args: list[str], short_tmp: Path, tmp_path: Path) -> None:
    # --scale: one broker with many sessions, and with PostgreSQL many hosts on it too;
    # --metrics: the cross-host relays serve their metrics, read every second meanwhile.
    chart = tmp_path / "bench.html"
    args = ["bench", "--quick", "--json", "--chart", str(chart), "--scale", "--metrics"]
    proc = run_cli([*args, *store_args], short_tmp, timeout=330)
    assert proc.returncode == 0, proc.stderr[-2000:]
    backends = ["postgres", "sqlite"] if store_args else ["sqlite"]
    report = json.loads(proc.stdout)
    check_bench(report, backends, scale=True)
    assert all(report["details"]["metrics_scrapes"][b] > 0 for b in backends), report["details"]
    check_chart(chart.read_text())
    assert list(short_tmp.iterdir()) == []  # temporary dirs removed
    assert leftovers(short_tmp) == []


# Long enough for a round of every kind (a takeover alone takes a few seconds).
EVERY_KIND_S = {"sqlite": "33", "postgres": "39"}


def test_chaos_covers_every_kind(store_args: list[str], short_tmp: Path, tmp_path: Path) -> None:
    backend = "postgres" if store_args else "sqlite"
    args = ["chaos", "--hosts", "3", "--duration", EVERY_KIND_S[backend], "--seed", "1", "--json"]
    proc = run_cli([*args, *store_args], short_tmp, timeout=170)
    # Every kind the backend allows but pg_restart (only against a server of the run's own),
    # less the disk faults where this machine cannot inject them: those must say why.
    unavailable = disk.unavailable(tmp_path, list(disk.DISK_KINDS))
    kinds = fault_kinds(backend, unavailable=unavailable)
    report = json.loads(proc.stdout)
    assert "error" not in report, (report, proc.stderr[-4000:])  # the run itself failed
    assert report["unavailable"] == unavailable
    assert report["not_run"] == []
    check_new_kinds(proc, kinds, short_tmp, proxied=bool(store_args))
    takeovers = [e for e in report["fault_log"] if e["fault"] == "relay_takeover"]
    # woken, each frozen relay exited fenced and handed nothing over
    assert all(e["fenced"] and e["stale_handovers"] == 0 for e in takeovers), takeovers
    assert report["unfenced"] == 0


def test_a_disk_fault_asked_for_where_it_cannot_run_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not root: the disk faults are left out of a default run, and asked for by name they
    are reported with the reason instead of passing untested."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    store = Store("sqlite:///x", parse_store_url("sqlite:///x"), "test")
    kinds, unavailable, not_run = chaos_kinds(store, tmp_path, None, False)
    assert set(unavailable) == {"inbox_readonly", "disk_full"}
    assert "needs root" in unavailable["disk_full"]
    assert not set(kinds) & set(unavailable) and not_run == []
    kinds, _, not_run = chaos_kinds(store, tmp_path, ["relay_kill", "disk_full"], False)
    assert (kinds, not_run) == (["relay_kill"], ["disk_full"])
    report = ChaosReport("sqlite", "test", 3, 1.0, 1, "now", not_run=not_run)
    assert not report.ok
    with pytest.raises(ValueError, match="needs root"):
        chaos_kinds(store, tmp_path, ["inbox_readonly"], False)


@pytest.mark.pg
@pytest.mark.skipif(pg_bin("initdb") is None, reason="no initdb: PostgreSQL server not installed")
def test_chaos_restarts_a_postgres_of_its_own(short_tmp: Path) -> None:
    kinds = ["pg_restart", "pg_cut", "hostile_rows"]
    args = ["chaos", "--hosts", "3", "--duration", "8", "--seed", "3", "--json", "--own-postgres"]
    proc = run_cli([*args, "--faults", ",".join(kinds)], short_tmp, timeout=120)
    check_new_kinds(proc, kinds, short_tmp, proxied=True)
    restarts = [e for e in json.loads(proc.stdout)["fault_log"] if e["fault"] == "pg_restart"]
    assert all(e["restart_took_s"] > 0 for e in restarts), restarts


def check_new_kinds(
    proc: subprocess.CompletedProcess[str], kinds: list[str], short_tmp: Path, *, proxied: bool
) -> None:
    report = json.loads(proc.stdout)
    assert set(report["faults"]) == set(kinds), report["faults"]
    assert report["acknowledged"] > 0
    assert report["lost"] == 0, report
    assert report["duplicated"] == 0, report
    # every injected bad row refused once with its reason, none handed to a listener
    assert report["injected"] > 0
    assert report["quarantined"] == report["injected"], report
    assert report["hostile_in_inboxes"] == 0
    assert set(report["quarantine_reasons"]) == {"bad_message", "forged_sender"}
    by_fault = report["by_fault"]
    # a fault followed at once by another may have no send of its own
    assert set(by_fault) <= {*kinds, "none"}, by_fault
    assert all(c["lost"] == 0 and c["duplicated"] == 0 for c in by_fault.values()), by_fault
    assert by_fault["hostile_rows"]["quarantined"] == report["injected"]
    if proxied:  # the proxy carried the relays' connections: a cut reset some
        cuts = [e for e in report["fault_log"] if e["fault"] == "pg_cut"]
        assert any(e["terminated"] > 0 for e in cuts), cuts
    takeovers = [e for e in report["fault_log"] if e["fault"] == "relay_takeover"]
    assert report["unfenced"] == 0, takeovers
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(short_tmp.iterdir()) == []
    assert leftovers(short_tmp) == []


def test_chaos_floods_coordination_beside_mail(store_args: list[str], short_tmp: Path) -> None:
    """Reservation and policy floods from one session at a time, beside the mail, relay kills
    and hostile rows: each flood meets its quota or rate, nothing acknowledged is lost or
    duplicated."""
    kinds = ["coord_flood", "hostile_rows", "relay_kill"]
    args = ["chaos", "--hosts", "3", "--duration", "10", "--seed", "5", "--json"]
    proc = run_cli([*args, *store_args, "--faults", ",".join(kinds)], short_tmp, timeout=150)
    check_new_kinds(proc, kinds, short_tmp, proxied=False)
    floods = [e for e in json.loads(proc.stdout)["fault_log"] if e["fault"] == "coord_flood"]
    assert floods, "no flood ran"
    refused = {code for e in floods for code in e["answered"]}
    assert refused & {"reservation_quota", "coord_rate_limited"}, floods


@pytest.mark.pg
def test_chaos_fails_over_a_postgres_of_its_own(short_tmp: Path) -> None:
    """A primary + synchronous standby of the run's own: the standby promoted under traffic,
    the old primary stopped and brought back as a standby; nothing acknowledged lost."""
    if pg_bin("initdb") is None or pg_bin("pg_basebackup") is None:
        from tests.pgharness import pg_unavailable

        pg_unavailable("no initdb / pg_basebackup: PostgreSQL server not installed")
    kinds = ["pg_failover", "hostile_rows"]
    args = ["chaos", "--hosts", "3", "--duration", "12", "--seed", "2", "--json", "--own-postgres"]
    proc = run_cli([*args, "--faults", ",".join(kinds)], short_tmp, timeout=170)
    check_new_kinds(proc, kinds, short_tmp, proxied=False)
    report = json.loads(proc.stdout)
    assert report["phantom"] == 0, report
    assert "synchronous standby" in report["store"]
    failovers = [e for e in report["fault_log"] if e["fault"] == "pg_failover"]
    assert failovers and all(e["synchronous"] for e in failovers)
    # mail flowed again after each one; the old primary came back as a standby
    assert all(e["flows_again_s"] is not None for e in failovers), failovers
    assert all("rejoin_s" in e for e in failovers), failovers


def test_chaos_kills_a_gateway_under_a_remote_sender(
    store_args: list[str], short_tmp: Path
) -> None:
    """A remote session sends through a gateway that is SIGKILLed and restarted under it: it is
    told honestly, and what it was told was taken arrives once."""
    kinds = ["gateway_kill", "hostile_rows", "relay_kill"]
    args = ["chaos", "--hosts", "3", "--duration", "10", "--seed", "7", "--json"]
    proc = run_cli([*args, *store_args, "--faults", ",".join(kinds)], short_tmp, timeout=150)
    check_new_kinds(proc, kinds, short_tmp, proxied=False)
    report = json.loads(proc.stdout)
    kills = [e for e in report["fault_log"] if e["fault"] == "gateway_kill"]
    assert kills and all(e["restart_after_s"] > 0 for e in kills), kills
    through = report["through_gateway"]
    assert through.get("delivered", 0) + through.get("queued", 0) > 0, through
