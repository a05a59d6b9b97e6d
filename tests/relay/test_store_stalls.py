"""A store connection that stops answering (blackholed through a proxy the test runs) is
detected and replaced within the documented deadline (docs/operations.md), and nothing
acknowledged is lost or doubled."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.engine import make_url

from crossintercom.config import ENV_STORE
from crossintercom.storage.engine import PG_CONNECT_TIMEOUT_S, PG_OPERATION_DEADLINE_S
from tests.proxy import TcpProxy
from tests.relay.conftest import Cluster, wait_for
from tests.relay.faultkit import ACKED, report, settle, stream


@pytest.mark.pg
def test_blackholed_store_connection_cut_and_replaced(pg_url: str) -> None:
    url = make_url(pg_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
    try:
        with Cluster(pg_url) as cluster:
            a = cluster.host("A", remote_ack_wait_s=1)
            b = cluster.host("B", relay=False)
            b.env[ENV_STORE] = url.set(host="127.0.0.1", port=proxy.port).render_as_string(
                hide_password=False
            )
            b.start_relay()
            worker = b.listen("worker")
            a.wait_sees("worker", "B")
            sender = a.client("boss")
            assert sender.send("worker@B", "before").outcome.value == "delivered"

            proxy.blackhole(drop=True)
            started = time.monotonic()
            during = stream(sender, "worker@B", 10, "while blackholed", concurrency=2)
            # The relay notices by itself: its in-flight operation is cut at the deadline.
            wait_for(
                lambda: "did not answer within" in b.relay_log(),
                PG_OPERATION_DEADLINE_S + PG_CONNECT_TIMEOUT_S + 10,
                "the relay to detect the stalled connection",
            )
            detected = time.monotonic() - started
            assert b.relay is not None and b.relay.poll() is None, b.relay_log()[-2000:]

            proxy.resume()
            restored = time.monotonic()
            after = stream(sender, "worker@B", 5, "after", concurrency=2)
            outcomes = during | after
            acked = {m for m, o in outcomes.items() if o in ACKED}
            held = settle(b, "worker", acked, worker, timeout=60)
            lost, dups = report(
                "store connection blackholed",
                outcomes,
                acked,
                held,
                detected_s=round(detected, 1),
                resumed_s=round(time.monotonic() - restored, 1),
            )
            assert (lost, dups) == (0, 0)
    finally:
        proxy.close()
