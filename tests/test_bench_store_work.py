"""The bench's server-side count of store work: statements from ``pg_stat_statements`` (on a
throwaway cluster started with it loaded, as ``bench --own-postgres`` does) and commits from
``pg_stat_database``, transaction control left out of the statements."""

from __future__ import annotations

import time

import psycopg
import pytest

from crossintercom.tools.bench.store_work import StoreCounters
from crossintercom.tools.pgcluster import ThrowawayPostgres, pg_bin

pytestmark = pytest.mark.skipif(
    pg_bin("initdb") is None, reason="no initdb: PostgreSQL server not installed"
)


def test_statements_are_counted_without_transaction_control() -> None:
    settings = {"shared_preload_libraries": "pg_stat_statements"}
    with ThrowawayPostgres(server_settings=settings) as server:
        conninfo = server.url
        counters = StoreCounters(conninfo)
        try:
            assert counters.statements, counters.statements_why
            commits0, statements0 = counters.read()
            assert statements0 is not None
            with psycopg.connect(conninfo) as conn:  # not autocommit: BEGIN ... COMMIT
                conn.execute("CREATE TABLE t (x int)")
                conn.execute("INSERT INTO t VALUES (1)")
                conn.commit()
                conn.execute("SELECT count(*) FROM t")
                conn.commit()
            # Three statements (and two BEGIN, two COMMIT) in two transactions. The counter's
            # own previous sum() and this read's xact_commit query are the two more it sees.
            commits1, statements1 = counters.read()
            assert statements1 is not None
            assert statements1 - statements0 == 3 + 2
            # Commits are published when a backend goes idle, at most once a second.
            deadline = time.monotonic() + 15
            while commits1 - commits0 < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
                commits1, _ = counters.read()
            assert commits1 - commits0 >= 2
        finally:
            counters.close()


def test_a_server_without_the_extension_says_why() -> None:
    with ThrowawayPostgres() as server:
        counters = StoreCounters(server.url)
        try:
            assert not counters.statements
            assert counters.statements_why is not None
            assert "--own-postgres" in counters.statements_why
            _, statements = counters.read()
            assert statements is None
        finally:
            counters.close()
