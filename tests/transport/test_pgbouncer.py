"""Through a real PgBouncer (docs/operations.md, "Poolers"). In session mode `db upgrade`
migrates, two hosts' relays exchange mail, each relay's listener stays LISTENing through the
pooler (on its one connection, which its statements use too) and a NOTIFY sent through it wakes
crossintercom's waiter. In transaction and statement
mode the relay, `db upgrade` and the overseer page refuse to start, in one line that names the
fix."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from crossintercom.storage import Waiter, open_store
from crossintercom.storage.blocking import run
from crossintercom.storage.wakeup import channel_name
from tests.conftest import make_env, run_cli, wait_for
from tests.relay.conftest import Cluster
from tests.transport.pooler import Mode, PgBouncer

pytestmark = pytest.mark.pg


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _backends(direct_url: str) -> set[str]:
    """application_name of this database's backends."""
    with psycopg.connect(_conninfo(direct_url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
    return {str(r[0]) for r in rows}


def test_session_mode_upgrades_relays_mail_and_wake_ups(
    pg_empty_url: str, runtime_home: Path
) -> None:
    pooler = PgBouncer(pg_empty_url, "session").start(pg_empty_url)
    try:
        pooled = pooler.url_for(pg_empty_url)
        env = make_env(runtime_home, "admin")
        upgraded = run_cli(env, "db", "upgrade", "--store", pooled, timeout=120)
        assert upgraded.returncode == 0, upgraded.stderr

        with Cluster(pooled) as cluster:
            a, b = cluster.up("A", "B")
            worker = b.listen("worker")
            a.wait_sees("worker", "B")
            sent = a.cli_json("send", "--as", "planner", "--to", "worker", "via pgbouncer")
            assert sent["outcome"] == "delivered", sent
            assert worker.next_message()["id"] == sent["id"]
            back = b.cli_json("send", "--as", "worker", "--to", "planner@A", "and back")
            assert back["outcome"] in ("delivered", "queued"), back

            # Each relay's one session (its statements and its LISTEN) goes through the pooler
            wait_for(
                lambda: (
                    {"crossintercom relay A", "crossintercom relay B"} <= _backends(pg_empty_url)
                ),
                30,
                f"both relays' sessions through the pooler: {pooler.log()[-2000:]}",
            )
        # ... and a NOTIFY sent through it reaches crossintercom's waiter behind it.
        conninfo = _conninfo(pooled)
        store = run(open_store(pooled, host_id="C"))
        try:
            _wake_through(store.waiter("C"), conninfo)
        finally:
            run(store.aclose())
    finally:
        pooler.stop()


def _wake_through(waiter: Waiter, conninfo: str) -> None:
    with waiter:
        assert waiter.wake(5.0) is not None  # the catch-up every waiter starts with
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_notify(%s, 'd')", (channel_name("C"),))
        woke: list[bool] = []

        def woken() -> bool:
            wake = waiter.wake(1.0)
            woke.append(wake is not None and wake.deliveries)
            return woke[-1]

        wait_for(woken, 30, "the NOTIFY to reach the waiter through the pooler")


@pytest.mark.parametrize("mode", ["transaction", "statement"])
def test_transaction_and_statement_mode_are_refused_at_start_with_the_fix(
    pg_url: str, runtime_home: Path, mode: Mode
) -> None:
    pooler = PgBouncer(pg_url, mode).start(pg_url)
    try:
        pooled = pooler.url_for(pg_url)
        env = {**make_env(runtime_home, "T"), "CROSSINTERCOM_STORE": pooled}
        for args in (("db", "upgrade"), ("relay",), ("web", "--listen", "127.0.0.1:0")):
            out = run_cli(env, *args, timeout=60)
            assert out.returncode != 0, (args, out.stdout, out.stderr)
            assert "Traceback" not in out.stderr
            [line] = [ln for ln in out.stderr.splitlines() if ln.strip()]
            assert f"{mode} mode" in line and "pool_mode = session" in line, line
            assert "Poolers" in line
    finally:
        pooler.stop()
