"""The listener across a promotion: a standby refuses LISTEN ("cannot execute LISTEN during
recovery"), which the driver treats as a lost connection; once that server is promoted, the
waiter LISTENs on the store's connection and reports a catch-up, then hints arrive. And what
the engine calls a failover error (storage/engine.py)."""

from __future__ import annotations

import psycopg
import pytest

from crossintercom.errors import StoreError
from crossintercom.storage import engine as db
from crossintercom.storage.blocking import run
from crossintercom.storage.interface import CATCH_UP
from crossintercom.storage.pgdriver import PgDriver
from crossintercom.storage.urls import parse_store_url
from crossintercom.storage.wakeup import PostgresWaiter, channel_name
from crossintercom.tools.pgcluster import pg_bin
from crossintercom.tools.pgreplica import ReplicatedPostgres
from tests.pgharness import pg_unavailable
from tests.procs import wait_for


@pytest.mark.pg
def test_a_waiter_on_a_standby_is_refused_and_listens_once_it_is_promoted() -> None:
    if pg_bin("pg_basebackup") is None or pg_bin("initdb") is None:
        pg_unavailable("the PostgreSQL server binaries (initdb, pg_basebackup) are missing")
    with ReplicatedPostgres(synchronous=False) as pair:
        assert pair.standby is not None
        standby = pair.standby
        with (
            pytest.raises(psycopg.Error) as refused,
            psycopg.connect(standby.conninfo(), autocommit=True) as conn,
        ):
            conn.execute("LISTEN ci_x")
        assert db.is_failover_error(refused.value)

        # The store's connection LISTENs before its first statement: on a standby the pool
        # replaces it, and the waiter cannot begin (the relay tries again a second later).
        url = f"postgresql+psycopg://postgres@127.0.0.1:{standby.port}/postgres"
        driver = PgDriver(parse_store_url(url))
        try:
            run(driver.run(lambda c: None, single_statement=True))
            waiter = PostgresWaiter(driver, "H", lambda: None)
            with pytest.raises(StoreError):
                waiter.__enter__()
            pair.fail_over()
            wait_for(lambda: _enters(waiter), 60, "the listener on the new primary")
            try:
                assert waiter.wake(1.0) == CATCH_UP
                with psycopg.connect(standby.conninfo(), autocommit=True) as conn:
                    conn.execute(f"NOTIFY {channel_name('H')}, 'd'")
                got = waiter.wake(30.0)
                assert got is not None and got.deliveries
            finally:
                waiter.close()
        finally:
            run(driver.aclose())


def _enters(waiter: PostgresWaiter) -> bool:
    try:
        waiter.__enter__()
    except StoreError:
        return False
    return True


@pytest.mark.parametrize(
    ("error", "failover"),
    [
        (
            psycopg.errors.ReadOnlySqlTransaction(
                "cannot execute INSERT in a read-only transaction"
            ),
            True,
        ),
        (psycopg.errors.CannotConnectNow("the database system is in recovery mode"), True),
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
        (psycopg.errors.FeatureNotSupported("cannot execute LISTEN during recovery"), True),
        (psycopg.errors.UniqueViolation("duplicate key value"), False),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),
    ],
)
def test_failover_errors(error: psycopg.Error, failover: bool) -> None:
    assert db.is_failover_error(error) is failover
    parsed = parse_store_url("postgresql://u:pw@h1:5432,h2:5433/db")
    if failover:
        message = db.unavailable(parsed, error).message
        assert "cannot take writes now" in message and "pw" not in message
        assert "primary" in message
