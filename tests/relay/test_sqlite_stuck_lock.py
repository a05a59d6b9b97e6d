"""A process frozen inside a write transaction on the shared SQLite file: every host's writes
wait; a relay whose writes time out on the lock says so in its log and in `status`, and carries
on by itself (nothing lost) once the frozen writer is gone."""

from __future__ import annotations

import signal
import subprocess
import sys

from sqlalchemy.engine import make_url

from tests.relay.conftest import Cluster, wait_for

# Takes the write lock, then stops itself inside the transaction.
FROZEN_WRITER = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE settings SET retention_s = retention_s")
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def test_stuck_write_lock_is_reported_and_survived(sqlite_store: str) -> None:
    path = str(make_url(sqlite_store).database)
    with Cluster(sqlite_store) as cluster:
        a, b = cluster.up("A", "B", A={"remote_ack_wait_s": 1})
        worker = b.listen("worker")
        a.wait_sees("worker", "B")
        planner = a.client("planner")
        assert planner.send("worker@B", "before").outcome.value == "delivered"

        frozen = subprocess.Popen(
            [sys.executable, "-c", FROZEN_WRITER, path], stdout=subprocess.PIPE, text=True
        )
        try:
            assert frozen.stdout is not None and frozen.stdout.readline().strip() == "locked"

            def reported() -> bool:
                relay = a.cli_json("status")["relay"]
                return "write lock" in (relay.get("store") or "")

            wait_for(reported, 60, "status to report the stuck lock")
            assert "has not answered for over" in a.relay_log()
            during = planner.send("worker@B", "while the file is locked")
            assert during.outcome.value in ("not_sent", "unknown", "queued"), during
        finally:
            frozen.send_signal(signal.SIGKILL)
            frozen.wait(10)
            if frozen.stdout is not None:
                frozen.stdout.close()

        def clear() -> bool:
            report = a.cli_json("status")
            return bool(report["relay"]["store"] == report["store"])

        wait_for(clear, 60, "status to show the store healthy again")
        after = planner.send("worker@B", "after")
        assert after.outcome.value == "delivered", after
        wait_for(lambda: after.id in worker.message_ids(), 30, "the later message printed")
        if during.outcome.value in ("queued", "unknown"):
            assert worker.message_ids()[during.id] <= 1
