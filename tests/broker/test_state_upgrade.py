"""A runtime dir whose ``broker.sqlite`` an earlier release wrote (version 0, before the schema
had a version; local_broker/state/schema.py): the broker upgrades it in place on start and goes on
with everything it held (queued mail, a known session, an awaited ack, dead letters, inbound
rules, held mail); a file of a newer release stops the broker, saying why, and is left as it
was (its ``schema_too_new`` code: tests/unit/test_broker_schema.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from crossintercom.local_broker.state import schema
from crossintercom.local_broker.state.store import BrokerState
from tests.broker_sqlite_v0 import dump, version, write_version_0
from tests.conftest import Listener, cli_json, kill_broker, run_cli, start_broker, wait_for


def test_a_version_0_runtime_dir_is_upgraded_and_the_broker_goes_on(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    env = cli_env
    cli_json(env, "inbound", "--as", "worker", "pest", "hold")  # worker: known, then away
    queued = cli_json(
        env, "send", "--as", "boss", "--to", "worker", "--ack-required", "the weekly report"
    )
    assert queued["outcome"] == "queued"
    held = cli_json(env, "send", "--as", "pest", "--to", "worker", "buy now")
    assert held["outcome"] == "queued"
    cli_json(env, "send", "--as", "boss", "--to", "nobody", "hello?", expect_rc=3)
    kill_broker(runtime_home)

    # The same rows in a file as the oldest releases wrote it (no wake column, no version).
    path = runtime_home / BrokerState.FILE
    rows = dump(path)
    path.unlink()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    write_version_0(path, rows, wake=False)
    assert version(path) == 0

    start_broker(env)
    assert cli_json(env, "status")["broker"]["queued"] == 1
    assert version(path) == schema.VERSION
    worker = Listener(env, "worker")
    got = worker.next_message()
    assert (got["id"], got["message"]) == (queued["id"], "the weekly report")
    state = cli_json(env, "inbound", "--as", "worker")
    assert state["rules"] == {"pest": "hold"}
    assert [h["id"] for h in state["held"]] == [held["id"]]
    [letter] = cli_json(env, "dead-letters", "--as", "boss")
    assert (letter["to"], letter["code"]) == ("nobody", "not_found")

    released = cli_json(env, "release", "--as", "worker", held["id"])
    assert released["released"] == 1
    assert worker.next_message()["id"] == held["id"]
    cli_json(env, "ack", "--as", "worker", queued["id"])
    [wait] = cli_json(env, "acks", "--as", "boss", "--sent")
    assert wait["id"] == queued["id"]
    wait_for(
        lambda: cli_json(env, "acks", "--as", "boss", "--sent")[0]["acknowledged"],
        30,
        "the acknowledgement",
    )


def test_a_broker_sqlite_of_a_newer_release_stops_the_broker(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    run_cli(cli_env, "wait", "--as", "worker", "--timeout", "0")  # a file with a session
    kill_broker(runtime_home)
    path = runtime_home / BrokerState.FILE
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {schema.VERSION + 1}")
    db.close()
    before = dump(path)

    out = run_cli(cli_env, "broker")  # in the foreground: its own error
    assert out.returncode == 1
    assert f"{path} has schema version {schema.VERSION + 1}, newer than" in out.stderr
    # A client that spawns it is told why it could not start.
    sent = cli_json(cli_env, "send", "--as", "boss", "--to", "worker", "hi", expect_rc=1)
    assert sent["error"]["code"] == "broker_unavailable"
    assert "newer than this crossintercom knows" in sent["error"]["message"]
    assert version(path) == schema.VERSION + 1
    assert dump(path) == before
