"""SIGTERM ends a relay within its service's stop timeout (deploy/*.service: 15 s) in every
state, the stuck one too: another writer holds the SQLite store's lock, so every operation of
the relay waits out the busy timeout in a worker thread (docs/operations.md, "Timeouts")."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

from tests.relay.conftest import Cluster

STOP_TIMEOUT_S = 15.0


def test_sigterm_ends_a_relay_stuck_behind_the_store_lock(sqlite_cluster: Cluster) -> None:
    (a,) = sqlite_cluster.up("A")
    a.listen("sink")
    store = Path(sqlite_cluster.store_url.removeprefix("sqlite:///"))
    holder = sqlite3.connect(store, isolation_level=None, timeout=30)
    holder.execute("BEGIN IMMEDIATE")  # a writer frozen inside its transaction
    try:
        relay = a.relay
        assert relay is not None
        # stuck: the heartbeat waits on the lock; status names the store as not answering
        deadline = time.monotonic() + 30
        while "has not answered" not in a.cli("status").stdout:
            assert time.monotonic() < deadline, a.cli("status").stdout
            time.sleep(0.2)
        asked = time.monotonic()
        relay.send_signal(signal.SIGTERM)
        relay.wait(STOP_TIMEOUT_S + 30)
        took = time.monotonic() - asked
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert took < STOP_TIMEOUT_S, f"the relay took {took:.1f} s to stop"
