"""The failover test's traffic through a pg_auto_failover formation (a monitor and two nodes,
started here) and `pg_autoctl perform failover`: nothing lost, duplicated or phantom, and mail
flows again. Skipped when pg_auto_failover is not installed, failed instead under
CROSSINTERCOM_REQUIRE_PG=1 (CI installs it: .ci/run)."""

from __future__ import annotations

import psycopg
import pytest

from crossintercom.storage import migrate
from crossintercom.storage.urls import parse_store_url
from tests.pgharness import pg_unavailable
from tests.relay import autofailover
from tests.relay.conftest import Cluster, wait_for
from tests.relay.failover import tally
from tests.relay.test_failover import drained, run_failover

pytestmark = pytest.mark.pg


def test_failover_through_pg_auto_failover_loses_and_duplicates_nothing() -> None:
    why = autofailover.available()
    if why is not None:
        pg_unavailable(why)
    with autofailover.Formation() as formation:
        admin = parse_store_url(formation.url("postgres")).libpq_conninfo()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE mail")
        url = formation.url("mail")
        migrate.upgrade(url)
        with Cluster(url) as cluster:
            hosts = cluster.up("A", "B")
            traffic, flowing_after = run_failover(formation.perform_failover, hosts)
            wait_for(lambda: drained(traffic), 60, "every acknowledged message to arrive")
            result = tally(traffic)
            print(f"pg_auto_failover: {result.outcomes}, mail again after {flowing_after:.2f} s")
            assert result.lost == []
            assert result.duplicated == []
            assert result.phantom_not_sent == []
