"""What the broker's crash and fault tests share (test_crash_points*.py): a broker that kills
itself at a fault point, what a client was handed, the CLI's `ask` in the background."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from crossintercom.client import Client
from crossintercom.models import durable_session_id
from tests.conftest import HOST_ID, RawConn, start_cli, wait_for
from tests.procs import BrokerProc, live_broker_pid

# The documented exit status of an `unknown` outcome, written out: a test of the contract, not
# of `crossintercom.exits`.
EXIT_UNKNOWN = 5


def sid(name: str) -> str:
    return durable_session_id(HOST_ID, name)


def faulty_broker(brokers: list[BrokerProc], env: dict[str, str], faults: str) -> BrokerProc:
    b = BrokerProc(env, faults)
    brokers.append(b)
    return b


def incoming_ids(client: Client, wait: float) -> list[str]:
    """Ids of every message handed to ``client`` within ``wait`` seconds."""
    out = []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        item = client.next_incoming(timeout=left)
        if item is not None and item.message is not None:
            out.append(item.message.id)
    return out


def start_ask(env: dict[str, str], text: str) -> subprocess.Popen[str]:
    """`crossintercom ask --as alice --to bob` in the background, waiting up to 40 s."""
    return start_cli(env, "ask", "--as", "alice", "--to", "bob", "--timeout", "40", "--json", text)


def asker_confirmed(home: Path) -> bool:
    """The asker confirmed its `delivered` outcome: the broker discarded the dedup record."""
    with RawConn(home) as conn:
        return bool(conn.request({"type": "status"})["dedup"]["records"] == 0)


def new_broker_serving(home: Path, dead_pid: int) -> int:
    pid = wait_for(lambda: live_broker_pid(home), 15, "a new broker")
    assert pid != dead_pid
    return int(pid)


def error_json(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    err: dict[str, Any] = json.loads(out.stdout)["error"]
    return err
