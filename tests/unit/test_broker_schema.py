"""``broker.sqlite``'s versioned schema (local_broker/state/schema.py), over real SQLite files:
a file written before the version existed (version 0, with and without the ``wake`` column) is
upgraded in place with every row kept and read back by the broker's rooms; a new file gets the
latest version and the same schema; a file newer than the code is refused and left as it was; later
steps run in order, once, and a failing one changes nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from crossintercom import protocol as p
from crossintercom.codes import Code
from crossintercom.errors import BrokerStateTooNew
from crossintercom.local_broker.coord.acks import AckBook
from crossintercom.local_broker.coord.deadletters import DeadLetterBook
from crossintercom.local_broker.coord.inbound_policy import InboundPolicy
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state import schema
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import (
    Message,
    Outcome,
    Peer,
    Receipt,
    SendResult,
    durable_session_id,
    new_id,
)
from tests.broker_sqlite_v0 import TABLES, columns, dump, version, write_version_0

HOST = "alpha"
WORKER = durable_session_id(HOST, "worker")
BOSS = durable_session_id(HOST, "boss")


def message(sender: str, name: str, text: str) -> Message:
    return Message(new_id(), Peer(sender, name, HOST), to=WORKER, text=text)


def live_rows(tmp: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Rows of every table as today's broker writes them, through its own rooms: queued mail
    and a receipt, a pending ask, a frame kept for the relay, asks sent and answered, an ack
    awaited, a send queued, two dead letters, inbound rules and held mail."""
    state = BrokerState(tmp)
    state.remember_session(WORKER, "worker", ["team"], "mentions")
    state.remember_session(BOSS, "boss", ["default"])
    queued = message(BOSS, "boss", "the weekly report")
    state.enqueue(WORKER, "message", queued.id, queued.to_dict(), 3600.0)
    receipt = Receipt(new_id(), Outcome.DELIVERED, WORKER)
    state.enqueue(BOSS, "receipt", receipt.id, receipt.to_dict(), 3600.0)
    ask = message(BOSS, "boss", "which branch?")
    state.add_pending(ask.id, WORKER, BOSS, HOST, ask.to_dict())
    state.outbox_put('{"type": "roster_refresh"}', 3600.0)
    state.record_ask(ask.id, BOSS, WORKER)
    state.answer_ask(new_id(), new_id())
    acks = AckBook(state, 3600.0)
    wanted = p.OutgoingBody(id=new_id(), message="please confirm", to="worker", ack_required=True)
    acks.expect(BOSS, wanted)
    dead = DeadLetterBook(state, 3600.0)
    dead.sent(BOSS, wanted, SendResult(wanted.id, Outcome.QUEUED))
    nowhere = p.OutgoingBody(id=new_id(), message="hello?", to="nobody")
    dead.sent(BOSS, nowhere, SendResult(nowhere.id, Outcome.REFUSED, Code.NOT_FOUND, "no one"))
    dead.note([Receipt(wanted.id, Outcome.EXPIRED, WORKER, Code.FORGOTTEN, "forgotten")])
    inbound = InboundPolicy(state, Registry(HOST, state))
    inbound.set(WORKER, "pest", "hold")
    inbound.set(WORKER, "*@beta", "refuse")
    inbound.hold(WORKER, message(new_id(), "pest", "buy now"))
    state.close()
    rows = dump(tmp / BrokerState.FILE)
    assert all(rows.values()), {t: r for t, r in rows.items() if not r}  # every table has rows
    return rows


@pytest.mark.parametrize("wake", [True, False], ids=["v0", "v0-before-wake"])
def test_a_version_0_file_is_upgraded_in_place_with_nothing_lost(
    tmp_path: Path, wake: bool
) -> None:
    (tmp_path / "live").mkdir()
    rows = live_rows(tmp_path / "live")
    home = tmp_path / "home"
    home.mkdir()
    path = home / BrokerState.FILE
    write_version_0(path, rows, wake=wake)
    assert version(path) == 0

    state = BrokerState(home)
    assert schema.version_of(state.db) == schema.VERSION
    after = dump(path)
    if not wake:  # the oldest files' sessions wake on every message, as they did
        rows["known_sessions"] = [(*r[:-1], None) for r in rows["known_sessions"]]
    assert after == rows
    assert columns(path) == columns(tmp_path / "live" / BrokerState.FILE)

    # The broker's rooms read it all back.
    known = state.known_sessions()
    assert (known[WORKER].name, known[WORKER].groups) == ("worker", ["team"])
    assert known[WORKER].wake == ("mentions" if wake else "every")
    [mail] = state.backlog(WORKER)
    assert mail.body["message"] == "the weekly report"
    assert [e.body["message"] for e in state.open_pending(WORKER)] == ["which branch?"]
    assert state.outbox_take() == ['{"type": "roster_refresh"}']
    [waiting] = AckBook(state, 3600.0).of(BOSS)
    assert (waiting.to, waiting.acknowledged_at) == ("worker", None)
    letters = {d.code for d in DeadLetterBook(state, 3600.0).of(BOSS)}
    assert letters == {Code.NOT_FOUND, Code.FORGOTTEN}
    inbound = InboundPolicy(state, Registry(HOST, state))
    assert inbound.rules(WORKER) == {"pest": "hold", "*@beta": "refuse"}
    [(_, held, _)] = inbound.held(WORKER)
    assert held["message"] == "buy now"
    # And writes to it as to a new file.
    state.enqueue(WORKER, "message", "m2", {"message": "again"}, 3600.0)
    assert len(state.backlog(WORKER)) == 2
    state.close()

    # Opened again: already at the latest version, nothing to do.
    again = BrokerState(home)
    assert schema.version_of(again.db) == schema.VERSION
    again.close()


def test_a_new_file_gets_the_latest_version(tmp_path: Path) -> None:
    BrokerState(tmp_path).close()
    path = tmp_path / BrokerState.FILE
    assert version(path) == schema.VERSION
    assert {name.split()[1] for name in columns(path) if name.startswith("table ")} >= set(TABLES)


def test_a_file_newer_than_the_code_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    state = BrokerState(tmp_path)
    state.enqueue(WORKER, "message", "m1", {"message": "kept"}, 3600.0)
    state.db.execute(f"PRAGMA user_version = {schema.VERSION + 1}")
    state.close()
    path = tmp_path / BrokerState.FILE
    before = dump(path)

    with pytest.raises(BrokerStateTooNew) as refused:
        BrokerState(tmp_path)
    assert refused.value.code == Code.SCHEMA_TOO_NEW
    assert refused.value.to_dict()["code"] == "schema_too_new"
    assert str(path) in refused.value.message
    assert f"schema version {schema.VERSION + 1}" in refused.value.message
    assert refused.value.to_dict()["known"] == schema.VERSION
    assert version(path) == schema.VERSION + 1
    assert dump(path) == before


def test_later_steps_run_in_order_once_and_a_failed_one_changes_nothing(tmp_path: Path) -> None:
    BrokerState(tmp_path).close()
    path = tmp_path / BrokerState.FILE
    db = sqlite3.connect(path, isolation_level=None)
    ran: list[str] = []

    def add_column(conn: sqlite3.Connection) -> None:
        ran.append("2")
        conn.execute("ALTER TABLE queue ADD COLUMN origin TEXT")

    def fill_it(conn: sqlite3.Connection) -> None:
        ran.append("3")
        conn.execute("UPDATE queue SET origin = 'here'")

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        raise sqlite3.OperationalError("disk I/O error")

    with pytest.raises(sqlite3.OperationalError):
        schema.upgrade(db, path, (*schema.STEPS, add_column, broken))
    assert schema.version_of(db) == schema.VERSION
    assert "origin" not in {r[1] for r in db.execute("PRAGMA table_info(queue)")}
    assert db.execute("SELECT 1 FROM sqlite_master WHERE name = 'half_done'").fetchone() is None

    ran.clear()
    schema.upgrade(db, path, (*schema.STEPS, add_column, fill_it))
    schema.upgrade(db, path, (*schema.STEPS, add_column, fill_it))
    assert ran == ["2", "3"]
    assert schema.version_of(db) == schema.VERSION + 2
    db.close()
