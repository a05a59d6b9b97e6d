"""deploy/prometheus/: the alert rules pass `promtool check rules`, and the rules and the
Grafana dashboard name only metrics a relay serves (relay/metrics.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from crossintercom.errors import StoreUnavailable
from crossintercom.models import Outcome, Receipt
from crossintercom.relay.metrics import RelayMetrics
from crossintercom.storage import Ack, QueuedMail

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "deploy" / "prometheus"
RULES = PROM / "crossintercom-alerts.yml"
DASHBOARD = PROM / "crossintercom-dashboard.json"
# .ci/run installs Debian's prometheus (promtool) and systemd (systemd-analyze) and sets this.
REQUIRE_TOOLS = "CROSSINTERCOM_REQUIRE_OPS_TOOLS"


def need(program: str) -> str:
    """The program's path; a failure in CI (REQUIRE_TOOLS), else a skip, when it is missing."""
    found = shutil.which(program)
    if found is None:
        if os.environ.get(REQUIRE_TOOLS):
            pytest.fail(f"{program} is not installed (Debian: apt-get install prometheus)")
        pytest.skip(f"{program} is not installed")
    return found


def served_names() -> set[str]:
    """Every metric name a relay serves, as Prometheus stores them (counters' _total, a
    histogram's _bucket/_count/_sum)."""
    metrics = RelayMetrics()
    metrics.state.queued = QueuedMail("A", 0, 0.0)
    metrics.state.peers = lambda: {"B": True}
    metrics.store_operation("enqueue", 0.01, None)
    # Labelled counters show once a label value was counted.
    metrics.store_operation("enqueue", 0.01, StoreUnavailable("down"))
    metrics.handed_in([], ["sender_forged"])
    metrics.forwarded([Receipt("m", Outcome.DELIVERED, "s")])
    metrics.handed_in([Ack("m", "s", "delivered", None, 1)])
    return {s.name for family in metrics.registry.collect() for s in family.samples}


def named_metrics(expr: str) -> set[str]:
    return set(re.findall(r"\b(crossintercom_[a-z_]+)", expr))


def test_promtool_checks_the_rules() -> None:
    promtool = need("promtool")
    out = subprocess.run(
        [promtool, "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_rules_and_dashboard_name_only_served_metrics() -> None:
    served = served_names()
    rules_text = RULES.read_text()
    exprs = re.findall(r"^\s+expr: (.*)$", rules_text, re.M)
    assert len(exprs) >= 9
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for expr in exprs:
        unknown = named_metrics(expr) - served
        assert not unknown, (expr, unknown)
    alerts = set(re.findall(r"^\s+- alert: (\w+)$", rules_text, re.M))
    assert {
        "CrossintercomRelayDown",
        "CrossintercomLeaseLost",
        "CrossintercomStoreUnreachable",
        "CrossintercomMailWaiting",
        "CrossintercomInDoubtCommits",
        "CrossintercomRowsQuarantined",
        "CrossintercomHostStoppedHeartbeating",
        "CrossintercomListenerDown",
    } <= alerts


def test_each_alert_fires_on_its_condition_after_its_window(tmp_path: Path) -> None:
    """`promtool test rules` over synthetic series (tests/relay/prometheus/alerts_test.yml)."""
    promtool = need("promtool")
    spec = (Path(__file__).parent / "prometheus" / "alerts_test.yml").read_text()
    copy = tmp_path / "alerts_test.yml"
    copy.write_text(spec.replace("  - RULES\n", f"  - {RULES}\n"))
    out = subprocess.run(
        [promtool, "test", "rules", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
