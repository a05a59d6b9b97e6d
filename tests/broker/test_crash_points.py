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
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from crossintercom.client import Client, Identity
from crossintercom.config import Settings
from crossintercom.models import Outcome, durable_session_id, new_id
from tests.conftest import (
    CLI,
    HOST_ID,
    Listener,
    RawConn,
    kill_broker,
    run_cli,
    settings_for,
    start_cli,
    wait_for,
)
from tests.soak import (
    BrokerProc,
    inbox_count,
    inbox_rows,
    live_broker_pid,
    queued_count,
)

EXIT_REFUSED, EXIT_NOT_SENT, EXIT_UNKNOWN, EXIT_NO_REPLY = 3, 4, 5, 6


def sid(name: str) -> str:
    return durable_session_id(HOST_ID, name)


@pytest.fixture
def cfg(cli_env: dict[str, str]) -> Settings:
    settings: Settings = settings_for(cli_env)
    return settings


@pytest.fixture
def brokers() -> Iterator[list[BrokerProc]]:
    started: list[BrokerProc] = []
    yield started
    for b in started:
        b.stop()


@pytest.fixture
def clients() -> Iterator[Callable[..., Client]]:
    opened: list[Client] = []

    def connect(cfg: Settings, name: str, **kw: Any) -> Client:
        c = Client(cfg, Identity.named(cfg, name), **kw).connect()
        opened.append(c)
        return c

    yield connect
    for c in reversed(opened):
        c.close()


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
    """The asker confirmed its `delivered` outcome: the broker released the dedup record."""
    with RawConn(home) as conn:
        return bool(conn.request({"type": "status"})["dedup"]["records"] == 0)


def new_broker_serving(home: Path, dead_pid: int) -> int:
    pid = wait_for(lambda: live_broker_pid(home), 15, "a new broker")
    assert pid != dead_pid
    return int(pid)


def error_json(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    err: dict[str, Any] = json.loads(out.stdout)["error"]
    return err


# --- (a) (b) (c): broker killed at each step of a send, Python API ------------------------------


@pytest.mark.parametrize(
    ("point", "outcome", "code", "held"),
    [
        # Reserved, never forwarded: the retry finds only a reservation for a local target.
        ("after_reserve", Outcome.UNKNOWN, "uncertain", 0),
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
        ("after_reserve", EXIT_UNKNOWN, 0),
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
        # start (the sqlite file stays, with the bare reservation in it).
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
    # Confirmed: the record is released, so the same id is a new operation. Observed: it is
    # forwarded again and acked; the inbox holds it once and the client does not hand the repeat
    # to the application, so the sender is told `delivered` and the recipient sees one message.
    again = alice.send("bob", "one", message_id=mid)
    assert (again.id, again.outcome) == (mid, Outcome.DELIVERED)
    assert incoming_ids(bob, 0.5) == []
    # A different payload under the released id cannot be saved (the inbox keeps the first one):
    # the recipient refuses it rather than let the sender believe it was delivered.
    other = alice.send("bob", "three", message_id=mid)
    assert (other.id, other.outcome, other.code) == (mid, Outcome.REFUSED, "id_conflict")
    assert incoming_ids(bob, 0.5) == []
    assert inbox_count(home, sid("bob"), mid) == 1
    rows = [r for r in inbox_rows(home, sid("bob")) if r[0] == mid]
    assert rows[0][2]["message"] == "one"


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


@pytest.mark.parametrize(("point", "held"), [("after_reserve", 0), ("after_forward", 1)])
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
