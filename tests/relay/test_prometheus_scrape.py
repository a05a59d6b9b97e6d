"""A real Prometheus (Debian's package) scrapes two relays while they exchange mail, and while
`crossintercom chaos` runs traffic with hostile rows: the counts it stored agree with what was
delivered and with the chaos report, and the "relay down" alert of deploy/prometheus fires
within its ``for:`` window once a relay stops (a test copy of the rules with a short window)."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.relay.conftest import Cluster, Host, wait_for
from tests.relay.metricskit import free_port
from tests.relay.test_prometheus_rules import RULES, need

SENT = 5
FOR_S = 3


class Prometheus:
    """A Prometheus server of the test's own: its config, data dir and loopback port."""

    def __init__(self, root: Path, targets: list[str]) -> None:
        self.port = free_port()
        rules = root / "rules.yml"
        # The relay-down alert's window made short; everything else as shipped.
        text = RULES.read_text()
        text, n = re.subn(
            r"(alert: CrossintercomRelayDown\n(?:.*\n)*?\s+for: )2m", rf"\g<1>{FOR_S}s", text
        )
        assert n == 1
        rules.write_text(text)
        config = root / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rules)],
                    "scrape_configs": [
                        {
                            "job_name": "crossintercom-relay",
                            "static_configs": [{"targets": targets}],
                        }
                    ],
                }
            )
        )
        self.log = root / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    need("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        wait_for(self.ready, 60, lambda: self.log.read_text()[-2000:])

    def _get(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read()) if path.startswith("/api") else resp.read()

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
        try:
            self._get("/-/ready")
        except OSError:
            return False
        return True

    def query(self, expr: str) -> dict[str, float]:
        """An instant query: instance -> value."""
        got = self._get("/api/v1/query?query=" + urllib.parse.quote(expr))
        assert got["status"] == "success", got
        return {
            r["metric"].get("instance", ""): float(r["value"][1]) for r in got["data"]["result"]
        }

    def alerts(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._get("/api/v1/alerts")["data"]["alerts"]
        return found

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def sqlite_hosts(sqlite_cluster: Cluster) -> Iterator[tuple[Host, Host, list[str]]]:
    hosts = [sqlite_cluster.host(h, relay=False) for h in ("A", "B")]
    targets = []
    for host in hosts:
        target = f"127.0.0.1:{free_port()}"
        host.env["CROSSINTERCOM_METRICS"] = target
        targets.append(target)
        host.start_relay(wait=False)
    for host in hosts:
        host.wait_relay()
    yield hosts[0], hosts[1], targets


def test_prometheus_counts_the_deliveries_and_alerts_on_a_stopped_relay(
    sqlite_hosts: tuple[Host, Host, list[str]], tmp_path: Path
) -> None:
    need("prometheus")
    a, b, (target_a, target_b) = sqlite_hosts
    prom = Prometheus(tmp_path, [target_a, target_b])
    try:
        # Both relays scraped and up before any traffic.
        wait_for(
            lambda: prom.query('up{job="crossintercom-relay"}') == {target_a: 1, target_b: 1},
            60,
            lambda: str(prom.query("up")),
        )
        worker = b.listen("worker")
        a.wait_sees("worker", "B")
        ids = set()
        for n in range(SENT):
            sent = a.cli_json("send", "--as", "planner", "--to", "worker", f"scraped {n}")
            assert sent["outcome"] == "delivered", sent
            ids.add(sent["id"])
        assert {worker.next_message()["id"] for _ in range(SENT)} == ids

        # What Prometheus stored agrees with what was delivered, on both sides.
        def counted() -> bool:
            fwd = prom.query('crossintercom_messages_forwarded_total{outcome="delivered"}')
            got = prom.query('crossintercom_messages_handed_in_total{outcome="delivered"}')
            return fwd.get(target_a) == SENT and got.get(target_b) == SENT

        wait_for(counted, 60, lambda: str(prom.query("crossintercom_messages_forwarded_total")))
        assert prom.query('sum(crossintercom_messages_forwarded_total{outcome!="delivered"})') in (
            {},
            {"": 0.0},
        )
        assert prom.query("crossintercom_listener_up") == {target_a: 1, target_b: 1}
        assert prom.query('crossintercom_host_up{host="B"}') == {target_a: 1}
        assert not [x for x in prom.alerts() if x["state"] == "firing"], prom.alerts()

        # B's relay stops: the relay-down alert fires once its window has passed.
        # Timed from before the stop: the relay stops answering scrapes before stop_relay
        # has seen it exit.
        stopped = time.time()
        b.stop_relay()

        def firing() -> dict[str, Any] | None:
            return next(
                (
                    x
                    for x in prom.alerts()
                    if x["labels"]["alertname"] == "CrossintercomRelayDown"
                    and x["state"] == "firing"
                ),
                None,
            )

        alert = wait_for(firing, 60, lambda: str(prom.alerts()))
        assert alert["labels"]["instance"] == target_b
        fired = time.time()
        # Pending from a scrape after the stop, firing a window later (scrapes and evaluations
        # every second): never before the window, and not long after it.
        assert FOR_S <= fired - stopped < FOR_S + 30, fired - stopped
        assert not [
            x
            for x in prom.alerts()
            if x["labels"]["alertname"] == "CrossintercomRelayDown"
            and x["labels"]["instance"] == target_a
        ]
    finally:
        prom.stop()


def test_prometheus_agrees_with_a_chaos_run(tmp_path: Path) -> None:
    """`crossintercom chaos` (two hosts, hostile rows written into the store) under a real
    Prometheus: what the relays counted, as Prometheus stored it, agrees with the chaos
    report's tally of what the senders were told and what was quarantined."""
    need("prometheus")
    from crossintercom.tools.chaos import run_chaos

    ports = [free_port(), free_port()]
    targets = [f"127.0.0.1:{p}" for p in ports]
    prom = Prometheus(tmp_path, targets)

    def last_look() -> None:
        # Everything drained: wait until Prometheus scraped both relays after this point.
        since = time.time()

        def scraped_since() -> bool:
            got = prom._get("/api/v1/query?query=" + urllib.parse.quote("timestamp(up)"))
            stamps = [float(r["value"][1]) for r in got["data"]["result"]]
            return len(stamps) == 2 and min(stamps) > since + 0.5

        wait_for(scraped_since, 60, "a scrape of both relays after the drain")

    try:
        report = run_chaos(
            None,
            hosts=2,
            duration=4,
            seed=3,
            faults=["hostile_rows"],
            metrics_ports=ports,
            before_stop=last_look,
        )
        assert report.ok, report.to_dict()
        assert report.cross_host.get("delivered", 0) > 0, report.cross_host
        # Counters are read from what Prometheus stored (the relays are gone by now).

        def stored(expr: str) -> float:
            got = prom.query(f"sum(last_over_time({expr}[10m]))")
            return got.get("", 0.0)

        for outcome in ("delivered", "queued", "not_sent", "unknown", "refused"):
            assert stored(
                f'crossintercom_messages_forwarded_total{{outcome="{outcome}"}}'
            ) == report.cross_host.get(outcome, 0), (outcome, report.cross_host)
        # Every message sent to another host and acknowledged was handed in there once.
        handed_in = stored('crossintercom_messages_handed_in_total{outcome=~"delivered|queued"}')
        assert handed_in == report.cross_host.get("delivered", 0) + report.cross_host.get(
            "queued", 0
        )
        assert report.injected > 0
        assert stored('crossintercom_messages_handed_in_total{outcome="refused"}') == (
            report.quarantined
        )
    finally:
        prom.stop()
