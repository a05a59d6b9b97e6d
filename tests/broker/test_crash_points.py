"""Crash and fault tests of the delivery contract (docs/delivery.md, issue 3), with real processes.

The broker under test is started by the test itself with ``CROSSINTERCOM_FAULTS`` naming the
point where it SIGKILLs itself; every client runs without the variable, so the broker a client
spawns after the crash is a clean one. For each case the test checks what the sender was told
(``SendResult`` or CLI exit code + JSON) and how often the recipient's inbox holds the message:
at most once, exactly once for ``delivered``/``queued``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from crossintercom.client import Client
from crossintercom.config import Settings
from crossintercom.models import Outcome, new_id
from tests.broker.crashkit import (
    EXIT_UNKNOWN,
    error_json,
    faulty_broker,
    incoming_ids,
    new_broker_serving,
    sid,
)
from tests.conftest import (
    CLI,
    Listener,
    run_cli,
    wait_for,
)
from tests.procs import (
    BrokerProc,
    inbox_count,
    inbox_rows,
    queued_count,
)

# --- (a) (b) (c): broker killed at each step of a send, Python API ------------------------------


@pytest.mark.parametrize(
    ("point", "outcome", "code", "held"),
    [
        # Lodged, never forwarded: the retry finds only a lodged record for a local target.
        ("after_lodge", Outcome.UNKNOWN, "uncertain", 0),
        # The recipient saved and acked it; the broker died before recording acceptance.
        ("after_forward", Outcome.UNKNOWN, "uncertain", 1),
        # Accepted, the sender never heard: the retry gets the retained outcome.
        ("after_accept", Outcome.DELIVERED, None, 1),
    ],
)
def test_broker_killed_during_send(
    point: str,
    outcome: Outcome,
    code: str | None,
    held: int,
    cli_env: dict[str, str],
    cfg: Settings,
    brokers: list[BrokerProc],
    clients: Callable[..., Client],
) -> None:
    broker = faulty_broker(brokers, cli_env, point)
    bob = clients(cfg, "bob")
    alice = clients(cfg, "alice")
    mid = new_id()
    result = alice.send("bob", f"hello at {point}", message_id=mid)
    # The client retried (after 1 s) against a broker it spawned itself.
    assert broker.wait_dead() == -signal.SIGKILL
    new_broker_serving(cfg.home, broker.pid)
    assert result.id == mid
    assert result.outcome is outcome
    assert result.code == code
    if outcome is Outcome.UNKNOWN:
        assert "not resend" in (result.message or "")
    # The recipient reconnects (resume): still no second hand-over.
    wait_for(bob.aio.connected.is_set, 15, "bob to reconnect")
    handed = incoming_ids(bob, 1.5)
    assert handed.count(mid) == held
    assert inbox_count(cfg.home, sid("bob"), mid) == held
    assert queued_count(cfg.home) == 0
    # The new broker serves: a new message is delivered once.
    after = alice.send("bob", "after the crash")
    assert after.outcome is Outcome.DELIVERED
    assert inbox_count(cfg.home, sid("bob"), after.id) == 1
    assert inbox_count(cfg.home, sid("bob"), mid) == held


# --- the same through the CLI: exit codes and JSON ---------------------------------------------


@pytest.mark.parametrize(
    ("point", "rc", "held"),
    [
        ("after_lodge", EXIT_UNKNOWN, 0),
        ("after_forward", EXIT_UNKNOWN, 1),
        ("after_accept", 0, 1),
    ],
)
def test_cli_send_broker_killed(
    point: str, rc: int, held: int, cli_env: dict[str, str], brokers: list[BrokerProc]
) -> None:
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    broker = faulty_broker(brokers, cli_env, point)
    bob = Listener(cli_env, "bob")
    out = run_cli(cli_env, "send", "--as", "alice", "--to", "bob", "--json", f"cli {point}")
    assert broker.wait_dead() == -signal.SIGKILL
    assert out.returncode == rc, (out.stdout, out.stderr)
    if rc == 0:
        body = json.loads(out.stdout)
        assert body["outcome"] == "delivered"
        mid = body["id"]
    else:
        err = error_json(out)
        assert (err["outcome"], err["code"]) == ("unknown", "uncertain")
        assert "resend" in err["message"]
        mid = err["id"]
    if held:
        shown = bob.messages(1)
        assert shown[0]["id"] == mid
    bob.no_message(2.0)  # listen reconnected to the new broker and shows nothing again
    assert inbox_count(home, sid("bob"), mid) == held


# --- (d): recipient killed after saving, before acking/showing --------------------------------


def test_listener_killed_after_save_shows_message_once_on_resume(
    cli_env: dict[str, str], brokers: list[BrokerProc]
) -> None:
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    faulty_broker(brokers, cli_env, "")
    crashing = Listener({**cli_env, "CROSSINTERCOM_FAULTS": "after_save"}, "bob")
    out = run_cli(cli_env, "send", "--as", "alice", "--to", "bob", "--json", "saved, not shown")
    assert out.returncode == 0, (out.stdout, out.stderr)
    body = json.loads(out.stdout)
    # bob is durable: its connection died before the ack, so the broker queued the message.
    assert body["outcome"] in ("queued", "delivered")
    mid = body["id"]
    assert crashing.proc.wait(10) == -signal.SIGKILL
    rows = [r for r in inbox_rows(home, sid("bob")) if r[1] == "message"]
    assert [(r[0], r[3]) for r in rows] == [(mid, False)]  # saved, never shown
    crashing.stop()
    resumed = Listener(cli_env, "bob")
    shown = resumed.messages(1)
    assert shown[0]["id"] == mid
    assert shown[0]["message"] == "saved, not shown"
    resumed.no_message(1.5)
    assert inbox_count(home, sid("bob"), mid) == 1
    wait_for(lambda: all(r[3] for r in inbox_rows(home, sid("bob"))), 10, "the message shown")
    assert queued_count(home) == 0
    # And only once more on a later restart: nothing.
    resumed.stop()
    again = Listener(cli_env, "bob")
    again.no_message(1.5)


# --- (e): sender killed while it waits between retries ----------------------------------------


def test_sender_killed_mid_retry(
    cli_env: dict[str, str],
    cfg: Settings,
    brokers: list[BrokerProc],
    clients: Callable[..., Client],
) -> None:
    home = cfg.home
    broker = faulty_broker(brokers, cli_env, "after_forward")
    # No reconnect for bob: after the crash only the sender tries to spawn a broker.
    bob = clients(cfg, "bob", reconnect=False)
    sender = subprocess.Popen(
        [*CLI, "send", "--as", "alice", "--to", "bob", "--json", "sent while dying"],
        env=cli_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert broker.wait_dead() == -signal.SIGKILL
        # Make every spawn fail until we say so: one authority file absent stops a broker at
        # start (the sqlite file stays, with the bare lodged record in it).
        key = home / "delivered-messages.key"
        aside = home / "key.aside"
        os.rename(key, aside)
        log = home / "broker.log"
        wait_for(
            lambda: log.exists() and "broker failed" in log.read_text(errors="replace"),
            15,
            "the sender's retry to fail to spawn a broker",
        )
        assert sender.poll() is None  # it waits to retry
        sender.send_signal(signal.SIGKILL)
        out, _ = sender.communicate(timeout=10)
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.communicate(timeout=10)
    assert sender.returncode == -signal.SIGKILL
    assert out == ""  # it was told nothing
    os.rename(aside, key)
    rows = [r for r in inbox_rows(home, sid("bob")) if r[1] == "message"]
    assert [r[2]["message"] for r in rows] == ["sent while dying"]  # once: it was forwarded
    first = rows[0][0]
    bob.close()
    # A new broker (spawned by the next command) keeps serving.
    after = run_cli(cli_env, "send", "--as", "alice", "--to", "bob", "--json", "next")
    assert after.returncode == 0, (after.stdout, after.stderr)
    assert json.loads(after.stdout)["outcome"] == "queued"  # bob is away
    next_id = json.loads(after.stdout)["id"]
    clients(cfg, "bob")  # bob returns: the queue is handed over
    wait_for(lambda: queued_count(home) == 0, 15, "bob's backlog to drain")
    assert inbox_count(home, sid("bob"), first) == 1
    assert inbox_count(home, sid("bob"), next_id) == 1


# --- (f): one message id, two payloads; and after the outcome was confirmed ------------------


def test_message_id_reuse(
    cli_env: dict[str, str],
    cfg: Settings,
    brokers: list[BrokerProc],
    clients: Callable[..., Client],
) -> None:
    home = cfg.home
    faulty_broker(brokers, cli_env, "")
    bob = clients(cfg, "bob")
    alice = clients(cfg, "alice")
    mid = new_id()
    # While the sender has not confirmed its outcome, the dedup record stands.
    alice.aio._confirm = lambda message_id: None  # type: ignore[method-assign]
    first = alice.send("bob", "one", message_id=mid)
    assert first.outcome is Outcome.DELIVERED
    conflict = alice.send("bob", "two", message_id=mid)
    assert (conflict.id, conflict.outcome, conflict.code) == (
        mid,
        Outcome.REFUSED,
        "payload_conflict",
    )
    retry = alice.send("bob", "one", message_id=mid)
    assert (retry.id, retry.outcome) == (mid, Outcome.DELIVERED)  # retained, not re-delivered
    assert incoming_ids(bob, 0.5) == [mid]
    del alice.aio._confirm
    confirmed = alice.send("bob", "one", message_id=mid)  # retained again, and now confirmed
    assert (confirmed.id, confirmed.outcome) == (mid, Outcome.DELIVERED)
    assert incoming_ids(bob, 0.5) == []
    # Confirmed: the record is discarded, so the same id is a new operation. Observed: it is
    # forwarded again and acked; the inbox holds it once and the client does not hand the repeat
    # to the application, so the sender is told `delivered` and the recipient sees one message.
    again = alice.send("bob", "one", message_id=mid)
    assert (again.id, again.outcome) == (mid, Outcome.DELIVERED)
    assert incoming_ids(bob, 0.5) == []
    # A different payload under the discarded id cannot be saved (the inbox keeps the first one):
    # the recipient refuses it rather than let the sender believe it was delivered.
    other = alice.send("bob", "three", message_id=mid)
    assert (other.id, other.outcome, other.code) == (mid, Outcome.REFUSED, "id_conflict")
    assert incoming_ids(bob, 0.5) == []
    assert inbox_count(home, sid("bob"), mid) == 1
    rows = [r for r in inbox_rows(home, sid("bob")) if r[0] == mid]
    assert rows[0][2]["message"] == "one"
