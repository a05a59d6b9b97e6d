"""`crossintercom relay --metrics`: two hosts exchange mail and each relay's endpoint counts it
(docs/operations.md, "Monitoring"), with bounded labels only."""

from __future__ import annotations

import math
import os
import re
import signal
from typing import Any

from crossintercom.relay.metrics import parse_address
from tests.relay.conftest import Cluster, Host, wait_for
from tests.relay.metricskit import Samples, free_port, scrape, total, value

SENT = 4


def _up_with_metrics(
    cluster: Cluster, *host_ids: str, **settings: dict[str, Any]
) -> tuple[list[Host], list[int]]:
    """``cluster.up`` with each relay serving metrics on a port of its own; ``settings`` as
    ``cluster.up``'s, by host id."""
    hosts = [cluster.host(h, relay=False, **settings.get(h, {})) for h in host_ids]
    ports = [free_port() for _ in hosts]
    for host, port in zip(hosts, ports, strict=True):
        host.env["CROSSINTERCOM_METRICS"] = f"127.0.0.1:{port}"
        host.start_relay(wait=False)
    for host in hosts:
        host.wait_relay()
    return hosts, ports


def test_two_relays_count_what_they_forward_and_hand_in(cluster: Cluster) -> None:
    (a, b), (port_a, port_b) = _up_with_metrics(cluster, "A", "B")
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    ids = set()
    for n in range(SENT):
        sent = a.cli_json("send", "--as", "planner", "--to", "worker", f"hello {n}")
        assert sent["outcome"] == "delivered", sent
        ids.add(sent["id"])
    assert {worker.next_message()["id"] for _ in range(SENT)} == ids

    got_a = scrape(port_a)
    assert value(got_a, "crossintercom_messages_forwarded_total", outcome="delivered") == SENT
    assert total(got_a, "crossintercom_messages_forwarded_total", outcome="not_sent") == 0
    # B's ack of the last batch may still be on its way when A's receipt arrived by hint.
    got_b: Samples = wait_for(
        lambda: (
            s
            if value(
                s := scrape(port_b), "crossintercom_messages_handed_in_total", outcome="delivered"
            )
            == SENT
            else None
        ),
        30,
        "B to count the deliveries it handed in",
    )
    for got, host in ((got_a, "A"), (got_b, "B")):
        assert value(got, "crossintercom_relay_generation") == 1
        assert value(got, "crossintercom_listener_up") == 1
        assert value(got, "crossintercom_broker_link_up") == 1
        assert total(got, "crossintercom_relay_info", host=host) == 1
        assert value(got, "crossintercom_store_errors_total", code="store_unavailable") is None
    assert value(got_a, "crossintercom_store_operation_duration_seconds_count", operation="enqueue")
    assert value(got_b, "crossintercom_store_operation_duration_seconds_count", operation="ack")
    assert value(got_b, "crossintercom_host_up", host="A") == 1
    # The lease and the mail waiting for the host come from the heartbeat loop; a beat read
    # before B's last ack still counts that message, so wait for a beat after it.
    late = wait_for(
        lambda: (
            s
            if value(s := scrape(port_b), "crossintercom_relay_lease_held") == 1
            and value(s, "crossintercom_queued_messages") == 0
            else None
        ),
        30,
        "the heartbeat's gauges to show no mail waiting",
    )
    assert value(late, "crossintercom_queued_oldest_age_seconds") == 0
    age = value(late, "crossintercom_relay_heartbeat_age_seconds")
    assert age is not None and not math.isnan(age)

    # No label carries a message id, a session's name or id, or free text.
    session_ids = {a.session_id("planner"), b.session_id("worker")}
    for got in (got_a, got_b, late):
        for _name, labels in got:
            for key, val in labels:
                assert val not in ids | session_ids | {"worker", "planner"}, (key, val)
                assert re.fullmatch(r"[A-Za-z0-9_.:+-]*", val), (key, val)


def test_mail_waiting_for_a_host_shows_in_its_gauges(cluster: Cluster) -> None:
    # A's sends give up waiting for B's answer after a second, not the default 5.
    (a, b), (_, port_b) = _up_with_metrics(cluster, "A", "B", A={"remote_ack_wait_s": 1})
    b.listen("worker")
    a.wait_sees("worker", "B")
    # B's broker frozen: B's relay reads the rows but cannot hand them over, so they wait.
    broker = b.broker_pid()
    assert broker is not None
    os.kill(broker, signal.SIGSTOP)
    try:
        for n in range(2):
            sent = a.cli_json("send", "--as", "planner", "--to", "worker", f"while frozen {n}")
            assert sent["outcome"] == "queued", sent
        got = wait_for(
            lambda: s if value(s := scrape(port_b), "crossintercom_queued_messages") == 2 else None,
            30,
            "B's relay to count the mail waiting for it",
        )
        oldest = value(got, "crossintercom_queued_oldest_age_seconds")
        assert oldest is not None and oldest > 0
    finally:
        os.kill(broker, signal.SIGCONT)
    wait_for(
        lambda: value(scrape(port_b), "crossintercom_queued_messages") == 0,
        60,
        "the gauge to fall once the mail is handed in",
    )


def test_this_hosts_reservations_show_in_its_gauges(cluster: Cluster) -> None:
    """Read with the queued mail (one grouped statement at every heartbeat), by mode; another
    host's reservations are that host's to count."""
    (a, b), (port_a, port_b) = _up_with_metrics(cluster, "A", "B")
    a.cli_json("reserve", "--as", "alice", "--project", "p", "src/**", "lib/**")
    a.cli_json("reserve", "--as", "ann", "--project", "p", "--shared", "docs/**")
    b.cli_json("reserve", "--as", "bob", "--project", "p", "tests/**")

    def a_counts() -> tuple[float | None, float | None]:
        s = scrape(port_a)
        return (
            value(s, "crossintercom_reservations", mode="exclusive"),
            value(s, "crossintercom_reservations", mode="shared"),
        )

    # A read may fall between alice's and ann's reservations: wait for both.
    wait_for(lambda: a_counts() == (2, 1), 30, lambda: f"A's counts (2, 1): {a_counts()}")
    wait_for(
        lambda: value(scrape(port_b), "crossintercom_reservations", mode="exclusive") == 1,
        30,
        "B's relay to count its own",
    )
    a.cli_json("unreserve", "--as", "alice", "--project", "p", "src/**")
    wait_for(
        lambda: value(scrape(port_a), "crossintercom_reservations", mode="exclusive") == 1,
        30,
        "the gauge to fall once a reservation is released",
    )


def test_held_mail_and_dead_letters_show_in_the_gauges(cluster: Cluster) -> None:
    """Both are the broker's (broker.sqlite), read through its status with the queued mail:
    B's worker holds A's mail and refuses a pest, whose refused send is A's dead letter."""
    (a, b), (port_a, port_b) = _up_with_metrics(cluster, "A", "B")
    b.listen("worker")
    a.listen("planner")
    a.listen("pest")
    a.wait_sees("worker", "B")
    b.cli_json("inbound", "--as", "worker", "pest@A", "refuse")
    b.cli_json("inbound", "--as", "worker", "*@A", "hold")
    a.cli_json("send", "--as", "pest", "--to", "worker", "buy now", expect_rc=3)
    for n in range(2):
        assert a.cli_json("send", "--as", "planner", "--to", "worker", f"plan {n}")["outcome"]
    wait_for(
        lambda: value(scrape(port_b), "crossintercom_held_messages") == 2,
        30,
        "B's relay to count the held mail",
    )
    wait_for(
        lambda: value(scrape(port_a), "crossintercom_dead_letters") == 1,
        30,
        "A's relay to count the refused send",
    )
    assert value(scrape(port_a), "crossintercom_held_messages") == 0


def test_metrics_address_forms() -> None:
    assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_address(":9464") == ("127.0.0.1", 9464)
    assert parse_address("9464") == ("127.0.0.1", 9464)
    assert parse_address("[::1]:9464") == ("::1", 9464)
