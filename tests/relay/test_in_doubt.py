"""A COMMIT in doubt never turns into a false ``not_sent`` (DESIGN §6).

A TCP proxy between the sending host's relay and PostgreSQL cuts the relay's connection the
moment it sends the write that commits an enqueue (its one statement, run in autocommit:
docs/storage.md); that write reaches the server later (or never).
The sender must be told ``delivered``/``queued`` (the row is there) or ``unknown``, never
``not_sent`` for a message that was stored, and the message arrives exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url

from crossintercom.config import ENV_STORE
from tests.proxy import TcpProxy
from tests.relay.conftest import Cluster, wait_for

pytestmark = pytest.mark.pg


@pytest.fixture
def proxy(pg_url: str) -> Iterator[TcpProxy]:
    url = make_url(pg_url)
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as p:
        yield p


@pytest.mark.parametrize(
    ("hold_s", "deliver"),
    [(0.0, True), (3.0, True), (0.5, False)],
    ids=["commit-lands-at-once", "commit-lands-3s-late", "commit-lost"],
)
def test_in_doubt_commit_is_never_not_sent(
    pg_url: str, proxy: TcpProxy, hold_s: float, deliver: bool
) -> None:
    proxied = make_url(pg_url).set(host="127.0.0.1", port=proxy.port)
    with Cluster(pg_url) as cluster:
        a = cluster.host("A", relay=False)
        a.env[ENV_STORE] = proxied.render_as_string(hide_password=False)
        a.start_relay()
        b = cluster.host("B")
        worker = b.listen("worker")
        a.wait_sees("worker", "B")
        planner = a.client("planner")
        assert planner.send("worker@B", "warm-up").outcome.value == "delivered"

        proxy.cut_after(b"INSERT INTO messages", hold_s=hold_s, deliver=deliver)
        result = planner.send("worker@B", "sent while the COMMIT is in doubt")
        assert proxy.cuts_on_pattern == 1, "the proxy never saw the enqueue's statement"
        outcome = result.outcome.value
        assert outcome != "not_sent", result
        assert outcome in ("delivered", "queued", "unknown"), result

        if outcome in ("delivered", "queued"):
            wait_for(lambda: result.id in b.inbox("worker"), 30, "the message to arrive")
        # the relay carries on through the proxy afterwards
        after = planner.send("worker@B", "after the cut")
        assert after.outcome.value == "delivered", after
        wait_for(lambda: after.id in worker.message_ids(), 30, "the later message printed")
        held = b.inbox("worker")
        assert held[result.id] <= 1
        if deliver:
            # the COMMIT reached the server: the message is stored, so it must arrive
            wait_for(lambda: result.id in b.inbox("worker"), 30, "the in-doubt message")
        assert all(c == 1 for c in worker.message_ids().values())
