"""Faults across hosts: relay crash, store outage, lapsed lease, a second or a stale relay.

Every case counts, from the recipient's inbox file(s) and the listener's printed output:
acknowledged messages lost (the sender saw ``delivered``/``queued`` but the message never
reached the recipient) must be 0, and duplicates (an id held or printed more than once) must be 0.
"""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from crossintercom.client import Client
from tests.relay.conftest import Cluster, wait_for
from tests.relay.faultkit import ACKED, report, settle, stream, stream_in_background

# --- (a) the recipient's relay is SIGKILLed in the middle of a stream, then restarted ---------


def test_recipient_relay_killed_mid_stream(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", A={"remote_ack_wait_s": 1})
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")

    thread, outcomes, errors = stream_in_background(planner, "worker@B", 200, "m", concurrency=8)
    wait_for(lambda: len(outcomes) >= 50 or not thread.is_alive(), 60, "50 outcomes")
    b.kill_relay()
    killed_at = len(outcomes)
    wait_for(lambda: len(outcomes) >= killed_at + 30 or not thread.is_alive(), 60, "more sends")
    b.start_relay()
    thread.join(120)
    assert not thread.is_alive() and not errors, errors
    assert len(outcomes) == 200

    acked = {i for i, o in outcomes.items() if o in ACKED}
    held = settle(b, "worker", acked, worker)
    printed = worker.message_ids()
    lost, dups = report(
        "relay_kill",
        outcomes,
        acked,
        held,
        killed_after=killed_at,
        printed_dups=sum(c - 1 for c in printed.values() if c > 1),
    )
    assert set(outcomes.values()) <= set(ACKED), Counter(outcomes.values())
    assert "queued" in outcomes.values()  # some really went out while B's relay was down
    assert lost == 0
    assert dups == 0
    assert all(c == 1 for c in printed.values()), printed.most_common(3)
    assert set(printed) <= set(outcomes)


def test_sender_relay_killed_mid_stream(cluster: Cluster) -> None:
    """The sending host's relay dies: outcomes turn honest (`unknown` for what was in flight,
    `not_sent`/`no_relay` while it is down); nothing acknowledged is lost, nothing reported
    `not_sent` ever arrives, and the restarted relay carries on from the store."""
    a, b = cluster.up("A", "B", A={"remote_ack_wait_s": 1})
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")

    thread, outcomes, errors = stream_in_background(planner, "worker@B", 120, "k", concurrency=8)
    wait_for(lambda: len(outcomes) >= 40 or not thread.is_alive(), 60, "40 outcomes")
    a.kill_relay()
    killed_at = len(outcomes)
    wait_for(lambda: len(outcomes) >= killed_at + 20 or not thread.is_alive(), 60, "more sends")
    a.start_relay()
    thread.join(120)
    assert not thread.is_alive() and not errors, errors
    assert len(outcomes) == 120

    wait_for(
        lambda: planner.send("worker@B", "after the restart").outcome.value == "delivered",
        60,
        "a send to be delivered after A's relay restarted",
    )
    acked = {i for i, o in outcomes.items() if o in ACKED}
    held = settle(b, "worker", acked, worker)
    not_sent = {i for i, o in outcomes.items() if o == "not_sent"}
    unknown = {i for i, o in outcomes.items() if o == "unknown"}
    lost, dups = report(
        "sender_relay_kill",
        outcomes,
        acked,
        held,
        killed_after=killed_at,
        unknown_arrived=len(unknown & set(held)),
    )
    assert set(outcomes.values()) <= {"delivered", "queued", "not_sent", "unknown"}
    assert not_sent, "no send met the dead relay"
    assert lost == 0
    assert dups == 0
    assert not (not_sent & set(held)), "a message reported not_sent was delivered"
    assert all(c == 1 for c in worker.message_ids().values())


# --- (b) the store unreachable for a while --------------------------------------------------------


def _admin_url(store_url: str) -> tuple[str, str]:
    url = make_url(store_url)
    admin = url.set(drivername="postgresql", database="postgres")
    return admin.render_as_string(hide_password=False), str(url.database)


def _cut_pg_connections(store_url: str, stop: threading.Event, rounds: list[int]) -> None:
    """Terminate every backend of the test database, over and over, until ``stop``."""
    admin, dbname = _admin_url(store_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        while not stop.is_set():
            cur = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )
            row = cur.fetchone()
            rounds.append(int(row[0]) if row else 0)
            stop.wait(0.05)


def _lock_sqlite(path: Path, stop: threading.Event, rounds: list[int]) -> None:
    """Hold an exclusive lock on the store file for 3 s at a time, with short gaps."""
    db = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        while not stop.is_set():
            db.execute("BEGIN EXCLUSIVE")
            rounds.append(1)
            stop.wait(3.0)
            db.execute("ROLLBACK")
            stop.wait(0.5)
    finally:
        db.close()


def test_store_unreachable_during_stream(cluster: Cluster, backend: str) -> None:
    a, b = cluster.up("A", "B", A={"remote_ack_wait_s": 2})
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    planner: Client = a.client("planner")

    stop = threading.Event()
    rounds: list[int] = []
    fault: Callable[[], None]
    if backend == "postgres":

        def fault() -> None:
            _cut_pg_connections(cluster.store_url, stop, rounds)

    else:
        path = Path(str(make_url(cluster.store_url).database))

        def fault() -> None:
            _lock_sqlite(path, stop, rounds)

    thread, outcomes, errors = stream_in_background(planner, "worker@B", 120, "s", concurrency=4)
    wait_for(lambda: len(outcomes) >= 20 or not thread.is_alive(), 60, "20 outcomes")
    injector = threading.Thread(target=fault, daemon=True)
    injector.start()
    wait_for(lambda: len(outcomes) >= 60 or not thread.is_alive(), 120, "sends under the fault")
    time.sleep(3.0 if backend == "postgres" else 5.0)  # keep the fault on for a while
    stop.set()
    injector.join(30)
    thread.join(150)
    assert not thread.is_alive() and not errors, errors
    assert len(outcomes) == 120
    assert rounds, "the fault was never injected"

    # recovery starts by itself: a fresh send goes through without restarting anything
    def fresh_send_delivered() -> bool:
        return planner.send("worker@B", "after the outage").outcome.value == "delivered"

    wait_for(fresh_send_delivered, 60, "a send to be delivered after the outage")

    acked = {i for i, o in outcomes.items() if o in ACKED}
    held = settle(b, "worker", acked, worker)
    not_sent = {i for i, o in outcomes.items() if o == "not_sent"}
    unknown = {i for i, o in outcomes.items() if o == "unknown"}
    lost, dups = report(
        f"store_outage_{backend}",
        outcomes,
        acked,
        held,
        fault_rounds=len(rounds),
        backends_terminated=sum(rounds) if backend == "postgres" else None,
    )
    assert set(outcomes.values()) <= {"delivered", "queued", "not_sent", "unknown"}
    assert lost == 0
    assert dups == 0
    # honest not_sent: nothing was stored, so it never arrives
    assert not (not_sent & set(held)), "a message reported not_sent was delivered"
    # unknown may or may not have arrived, but at most once
    assert all(held[i] <= 1 for i in unknown)
    printed = worker.message_ids()
    assert all(c == 1 for c in printed.values()), printed.most_common(3)


# --- (c) another host's relay dead long enough for its lease to lapse -----------------------------


def test_lapsed_lease_shows_offline_and_queues(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", A={"lease_s": 2, "remote_ack_wait_s": 1})
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")
    first = planner.send("worker@B", "before")
    assert first.outcome.value == "delivered"

    b.kill_relay()  # no goodbye: only the lapsed lease can tell A
    a.wait_sees("worker", "B", online=False, timeout=30)
    listed = {(s["name"], s["host"]): s for s in a.cli_json("list")}
    assert listed[("worker", "B")]["online"] is False

    outcomes = {first.id: first.outcome.value}
    for i in range(5):
        r = planner.send("worker", f"while B is dark {i}")
        outcomes[r.id] = r.outcome.value
    dark = {i for i, o in outcomes.items() if i != first.id}
    assert {outcomes[i] for i in dark} == {"queued"}, outcomes
    assert not (dark & set(b.inbox("worker")))  # not delivered while B is dark

    b.start_relay()
    a.wait_sees("worker", "B", online=True)
    acked = set(outcomes)
    held = settle(b, "worker", acked, worker)
    lost, dups = report("lease_lapse", outcomes, acked, held)
    assert lost == 0
    assert dups == 0
    assert all(c == 1 for c in worker.message_ids().values())


def _store_idle_for(store_url: str, host_id: str) -> bool:
    """True when nothing holds the locks a new relay for ``host_id`` needs first (its hosts and
    roster rows; for SQLite the whole file)."""
    if store_url.startswith("postgresql"):
        admin, dbname = _admin_url(store_url)
        url = make_url(admin).set(database=dbname).render_as_string(hide_password=False)
        try:
            with psycopg.connect(url) as conn:
                for table in ("hosts", "roster"):
                    conn.execute(
                        f"SELECT 1 FROM {table} WHERE host_id = %s FOR UPDATE NOWAIT", (host_id,)
                    )
                conn.rollback()
        except psycopg.errors.LockNotAvailable:
            return False
        return True
    db = sqlite3.connect(str(make_url(store_url).database), timeout=0.2, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()
    return True


def pause_between_transactions(proc: Any, store_url: str, host_id: str) -> None:
    """SIGSTOP a relay at a moment it holds no store lock (a paused relay mid-transaction would
    block its successor: a hazard of its own, not the one this test is about)."""

    def paused_idle() -> bool:
        proc.send_signal(signal.SIGSTOP)
        if _store_idle_for(store_url, host_id):
            return True
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.05)
        return False

    wait_for(paused_idle, 30, "the old relay to pause between transactions")


# --- (d) one relay per host id -----------------------------------------------------------------


def test_second_relay_refused_and_other_machine_fences_old(cluster: Cluster) -> None:
    a, old = cluster.up("A", "B", A={"remote_ack_wait_s": 1})
    worker_old = old.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")

    # a second relay for the same host id on the same machine is refused at once
    second = old.spawn_relay()
    assert second.wait(30) != 0
    log = old.relay_log(second)
    assert "already running" in log and "relay.lock" in log, log
    assert old.relay is not None and old.relay.poll() is None  # the first one is unharmed

    part1 = stream(planner, "worker@B", 30, "p1")
    assert set(part1.values()) == {"delivered"}, Counter(part1.values())
    settle(old, "worker", set(part1), worker_old)

    # the session moves to another machine with the same host id; the old relay is stalled
    assert worker_old.stop() == 0
    assert old.relay is not None
    pause_between_transactions(old.relay, cluster.store_url, "B")
    try:
        # Another machine (its own runtime dir): it waits out the stalled relay's lease
        # (lease_s, shortened here) before taking the host id over.
        new = cluster.host("B", dirname="B2", lease_s=3)
        worker_new = new.listen("worker")
        a.wait_sees("worker", "B", online=True)
        part2 = stream(planner, "worker@B", 30, "p2")
        acked2 = {i for i, o in part2.items() if o in ACKED}
        assert acked2 == set(part2), Counter(part2.values())
    finally:
        old.relay.send_signal(signal.SIGCONT)

    # the stale relay notices it was fenced out and stops with a clear error
    code = old.relay.wait(30)
    assert code != 0
    log = old.relay_log()
    assert "took over" in log, log[-2000:]

    # it changed nothing on its way out: worker@B stays online and reachable on the new machine
    time.sleep(1.0)
    a.wait_sees("worker", "B", online=True)
    last = planner.send("worker@B", "after the takeover")
    assert last.outcome.value == "delivered", last
    acked2.add(last.id)
    held_new = settle(new, "worker", acked2, worker_new)
    held_old = old.inbox("worker")
    both: Counter[str] = Counter()
    both.update(held_old)
    both.update(held_new)
    everything = {**part1, **part2, last.id: last.outcome.value}
    acked = {i for i, o in everything.items() if o in ACKED}
    lost, dups = report("takeover", everything, acked, both)
    assert lost == 0
    assert dups == 0
    assert set(part1) <= set(held_old)
    assert acked2 <= set(held_new)
    assert all(c == 1 for c in worker_new.message_ids().values())
