"""Crash and fault tests of the delivery contract, continued (docs/delivery.md): a broker
killed in the middle of `crossintercom ask`, and queued mail that expires with a receipt for
its sender. How the broker under test crashes: test_crash_points.py's docstring."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from crossintercom.client import Client
from crossintercom.config import Settings
from crossintercom.models import Outcome
from tests.broker.crashkit import (
    EXIT_UNKNOWN,
    asker_confirmed,
    error_json,
    faulty_broker,
    incoming_ids,
    new_broker_serving,
    sid,
    start_ask,
)
from tests.conftest import (
    RawConn,
    kill_broker,
    run_cli,
    settings_for,
    wait_for,
)
from tests.procs import (
    BrokerProc,
    inbox_count,
    inbox_rows,
    queued_count,
)

# --- (g): a person kills the broker in the middle of `crossintercom ask` -----------------------


def test_ask_broker_killed_while_waiting_for_reply(
    cli_env: dict[str, str],
    cfg: Settings,
    brokers: list[BrokerProc],
    clients: Callable[..., Client],
) -> None:
    home = cfg.home
    faulty_broker(brokers, cli_env, "")
    bob = clients(cfg, "bob")
    asker = start_ask(cli_env, "question?")
    try:
        item = bob.next_incoming(timeout=15)
        assert item is not None and item.message is not None
        ask_id = item.message.id
        assert item.message.expects_reply

        wait_for(partial(asker_confirmed, home), 15, "the asker to confirm its outcome")
        kill_broker(home)  # the person's SIGKILL, while `ask` waits for the reply
        answer = bob.reply("answer!", reply_to=ask_id)  # bob's client respawns a broker
        assert answer.outcome in (Outcome.DELIVERED, Outcome.QUEUED)
        out, err = asker.communicate(timeout=45)
    finally:
        if asker.poll() is None:
            asker.kill()
            asker.communicate(timeout=10)
    # The ask re-registered with the new broker and got its reply (not a wait to the timeout).
    assert asker.returncode == 0, (out, err)
    body = json.loads(out)
    assert (body["id"], body["outcome"]) == (ask_id, "delivered")
    assert body["reply"]["message"] == "answer!"
    assert body["reply"]["reply_to"] == ask_id
    assert inbox_count(home, sid("bob"), ask_id) == 1
    assert inbox_count(home, sid("alice"), answer.id) == 1
    assert incoming_ids(bob, 0.5) == []  # never handed to bob twice


def test_ask_beside_own_listener_gets_reply_after_broker_restart(
    cli_env: dict[str, str],
    cfg: Settings,
    brokers: list[BrokerProc],
    clients: Callable[..., Client],
) -> None:
    """alice listens *and* asks from a one-shot process attached to her session. After a
    broker restart the ask re-registers announcing the ask it waits on, so the reply goes to
    the asking process, not to alice's listener as a late message."""
    home = cfg.home
    faulty_broker(brokers, cli_env, "")
    bob = clients(cfg, "bob")
    alice = clients(cfg, "alice")  # the listener: owns alice and reconnects by itself
    asker = start_ask(cli_env, "q?")
    try:
        item = bob.next_incoming(timeout=15)
        assert item is not None and item.message is not None
        ask_id = item.message.id

        wait_for(partial(asker_confirmed, home), 15, "the asker to confirm its outcome")
        old = kill_broker(home)
        assert old is not None
        new_broker_serving(home, old)

        def both_back() -> bool:  # alice's listener is registered again
            try:
                with RawConn(home) as conn:
                    sessions = conn.request({"type": "list"})["sessions"]
            except OSError:  # the new broker may not accept connections yet
                return False
            return any(x["name"] == "alice" and x["online"] for x in sessions)

        wait_for(both_back, 15, "alice's listener to reconnect")

        def ask_back() -> bool:  # the one-shot ask re-registered, naming the ask it waits on
            with RawConn(home) as conn:
                return bool(conn.request({"type": "status"})["asks_waiting"] == 1)

        wait_for(ask_back, 15, "the asking process to re-register its ask")
        answer = bob.reply("answer!", reply_to=ask_id)
        assert answer.outcome is Outcome.DELIVERED
        out, err = asker.communicate(timeout=45)
    finally:
        if asker.poll() is None:
            asker.kill()
            asker.communicate(timeout=10)
    assert asker.returncode == 0, (out, err)
    assert json.loads(out)["reply"]["message"] == "answer!"
    assert incoming_ids(alice, 0.5) == []  # not also shown to the listener as a late reply


@pytest.mark.parametrize(("point", "held"), [("after_lodge", 0), ("after_forward", 1)])
def test_ask_broker_killed_during_delivery(
    point: str,
    held: int,
    cli_env: dict[str, str],
    cfg: Settings,
    brokers: list[BrokerProc],
    clients: Callable[..., Client],
) -> None:
    broker = faulty_broker(brokers, cli_env, point)
    bob = clients(cfg, "bob")
    out = run_cli(cli_env, "ask", "--as", "alice", "--to", "bob", "--timeout", "20", "--json", "q?")
    assert broker.wait_dead() == -signal.SIGKILL
    assert out.returncode == EXIT_UNKNOWN, (out.stdout, out.stderr)
    err = error_json(out)
    assert (err["outcome"], err["code"]) == ("unknown", "uncertain")
    handed = incoming_ids(bob, 1.0)
    assert handed.count(err["id"]) == held
    assert inbox_count(cfg.home, sid("bob"), err["id"]) == held


# --- (h): expiry of a queued message, with an `expired` receipt for the sender ------------------


def _short_retention(home: Path, retention_s: float) -> None:
    (home / "config.json").write_text(
        json.dumps({"retention_s": retention_s, "sweep_interval_s": 0.2})
    )


def test_queued_message_expires_with_receipt(
    cli_env: dict[str, str], brokers: list[BrokerProc], clients: Callable[..., Client]
) -> None:
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    _short_retention(home, 2)
    cfg: Settings = settings_for(cli_env)
    assert (cfg.retention_s, cfg.sweep_interval_s) == (2.0, 0.2)
    faulty_broker(brokers, cli_env, "")
    clients(cfg, "bob").close()  # bob is known (durable) and away
    alice = clients(cfg, "alice")
    sent = alice.send("bob", "will expire")
    assert sent.outcome is Outcome.QUEUED
    item = alice.next_incoming(timeout=20)
    assert item is not None and item.receipt is not None
    assert item.receipt.id == sent.id
    assert item.receipt.outcome == "expired"
    assert item.receipt.recipient == sid("bob")
    receipts = [r for r in inbox_rows(home, sid("alice")) if r[1] == "receipt"]
    assert [(r[2]["id"], r[2]["outcome"]) for r in receipts] == [(sent.id, "expired")]
    # The receipt stays queued until alice's ack reaches the broker, then leaves the queue.
    wait_for(lambda: queued_count(home, "receipt") == 0, 10, "the acknowledged receipt to go")
    bob = clients(cfg, "bob")  # back: the expired message is not handed over
    assert incoming_ids(bob, 1.0) == []
    assert inbox_count(home, sid("bob"), sent.id) == 0


def test_queued_receipt_is_acked_and_does_not_block_the_backlog(
    cli_env: dict[str, str], brokers: list[BrokerProc], clients: Callable[..., Client]
) -> None:
    """An `expired` receipt queued for an absent sender is acked when handed over, so it leaves
    the queue and the messages queued behind it are dequeued too (not expired after delivery)."""
    home = Path(cli_env["CROSSINTERCOM_HOME"])
    _short_retention(home, 3)
    cfg: Settings = settings_for(cli_env)
    faulty_broker(brokers, cli_env, "")
    clients(cfg, "bob").close()
    carol = clients(cfg, "carol")
    alice = clients(cfg, "alice")
    sent = alice.send("bob", "will expire")
    assert sent.outcome is Outcome.QUEUED
    alice.close()  # alice is away when it expires: her receipt is queued

    def receipt_queued() -> bool:
        return any(r[0] == sid("alice") for r in _queue(home))

    wait_for(receipt_queued, 20, "the expired receipt queued for alice")
    behind = carol.send("alice", "queued behind the receipt")
    assert behind.outcome is Outcome.QUEUED
    alice = clients(cfg, "alice")  # back within the retention: receipt, then carol's message
    wait_for(lambda: _queue(home) == [], 20, "alice's backlog to drain")
    time.sleep(1.0)  # a sweep or more: nothing of alice's may expire now
    assert inbox_count(home, sid("alice"), behind.id) == 1
    carols = [r[2] for r in inbox_rows(home, sid("carol")) if r[1] == "receipt"]
    assert carols == []  # carol is never told her delivered message expired
    receipts = [r[2] for r in inbox_rows(home, sid("alice")) if r[1] == "receipt"]
    assert [(r["id"], r["outcome"]) for r in receipts] == [(sent.id, "expired")]


def _queue(home: Path) -> list[tuple[str, str, str]]:
    import sqlite3

    db = sqlite3.connect(f"file:{home / 'broker.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute("SELECT recipient, kind, item_id FROM queue ORDER BY seq").fetchall()
    finally:
        db.close()
    return [(r[0], r[1], r[2]) for r in rows]
