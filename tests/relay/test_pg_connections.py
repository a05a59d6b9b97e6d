"""What one relay costs a PostgreSQL server (docs/storage.md, "Connections" and "Idle load";
docs/operations.md, "Sizing"): one connection, its statements' (the archive's included) and
its LISTEN on the same one, with the archive on and writing; and, idle, at most 0.2 commits
per second at the product's own pace (heartbeat_s = lease_s / 3), counted by the server
(``pg_stat_database.xact_commit``) over a measured window, with its metrics served (their
reads of the store ride in the heartbeat: relay/chores.py).

On a throwaway server with autovacuum off: its workers' visits to the database are
transactions counted there too (about one a minute), and the figure is the relay's."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from crossintercom.storage import migrate
from crossintercom.storage.engine import application_name
from crossintercom.tools.pgcluster import ThrowawayPostgres, pg_bin
from tests.relay.conftest import Cluster, Host, wait_for
from tests.relay.metricskit import free_port, scrape, value
from tests.relay.test_archive import archived_ids, turn_archive_on

pytestmark = [
    pytest.mark.pg,
    pytest.mark.skipif(pg_bin("initdb") is None, reason="no initdb: no PostgreSQL server"),
]

IDLE_COMMITS_PER_S = 0.2
# Four heartbeats of the product's default 5 s: the window opens just after a commit was seen,
# so it holds at most four more when nothing else commits.
WINDOW_S = 20.0
# Nothing committed for this long before the window: the relay is idle (beats 5 s apart).
QUIET_S = 4.0
DB = "crossintercom"

Admin = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def quiet_server() -> Iterator[ThrowawayPostgres]:
    with ThrowawayPostgres(server_settings={"autovacuum": "off"}) as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        migrate.upgrade(store_url(server))
        yield server


def store_url(server: ThrowawayPostgres) -> str:
    return server.url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + "/" + DB


def connections(admin: Admin) -> dict[str, int]:
    """Backends on the store's database, by application_name (counted from another one)."""
    rows = admin.execute(
        "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s "
        "GROUP BY application_name",
        (DB,),
    ).fetchall()
    return {str(name): int(str(n)) for name, n in rows}


def commits(admin: Admin) -> int:
    """Transactions committed on the store's database so far (read from another database, so
    the reads are not counted; each read in a transaction of its own sees the newest)."""
    row = admin.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (DB,))
    found = row.fetchone()
    assert found is not None
    return int(str(found[0]))


def quiet_host(cluster: Cluster) -> tuple[Host, int]:
    """Host A alone on the store, at the product's heartbeat (the tests' is shorter), with the
    archive on and its metrics served on the port returned."""
    a = cluster.host("A", relay=False, heartbeat_s=5.0)
    turn_archive_on(a)
    port = free_port()
    a.env["CROSSINTERCOM_METRICS"] = f"127.0.0.1:{port}"
    a.start_relay()
    return a, port


def test_a_relay_with_the_archive_on_holds_one_connection_and_idles_at_one_commit_a_beat(
    quiet_server: ThrowawayPostgres,
) -> None:
    url = store_url(quiet_server)
    with Cluster(url) as cluster, psycopg.connect(quiet_server.url, autocommit=True) as admin:
        a, port = quiet_host(cluster)
        worker = a.listen("worker")  # a same-host recipient: its mail is archived too
        planner = a.client("planner")
        sent = [planner.send("worker@A", f"m{i}").id for i in range(10)]
        wait_for(lambda: len(worker.message_ids()) == 10, 30, "every message printed")
        # The copies are written through the relay's own connection.
        wait_for(lambda: set(sent) <= archived_ids(url), 30, "the archive to hold them")
        # Only the relay's one connection (the test's own reads above have closed theirs).
        mine = {application_name("relay", "A"): 1}
        wait_for(
            lambda: connections(admin) == mine,
            10,
            lambda: f"only {mine}: {connections(admin)}",
            interval=0.2,
        )

        # The sends' after-effects (receipts shown, their copies) settle: then a commit alone
        # after a quiet (a heartbeat's, nothing else pending) opens the window.
        last = [commits(admin), time.monotonic()]

        def lone_commit_after_quiet() -> bool:
            now, count = time.monotonic(), commits(admin)
            moved, quiet = count - last[0], now - last[1]
            if moved:
                last[:] = [count, now]
            return moved == 1 and quiet >= QUIET_S

        wait_for(lone_commit_after_quiet, 90, "a heartbeat's commit after a quiet")
        c0, t0 = commits(admin), time.monotonic()
        time.sleep(WINDOW_S)
        c1, elapsed = commits(admin), time.monotonic() - t0
        assert c1 > c0, "the heartbeat stopped"
        assert (c1 - c0) / elapsed <= IDLE_COMMITS_PER_S, (c1 - c0, round(elapsed, 2))
        seen = connections(admin)
        assert sum(seen.values()) <= 1, seen
        # The metrics' reads of the store ran meanwhile (nothing waits for this host).
        assert value(scrape(port), "crossintercom_queued_messages") == 0
