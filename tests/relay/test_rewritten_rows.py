"""A writer of the store installs a trigger that rewrites other hosts' messages as they are
written (and keeps doing so after its own access is gone). The receiving relay checks each
row's payload against the digest its sender stored: a rewritten message is refused with a
logged reason, never delivered. On SQLite the relay names the foreign trigger at start, and a store
file others may read, in its log and in `status` (docs/operations.md, "Trust model")."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from crossintercom.tools.chaos.rogue import delivery_reasons
from tests.relay.conftest import Cluster, wait_for

SQLITE_TRIGGER = (
    "CREATE TRIGGER ci_rewrite AFTER INSERT ON messages WHEN NEW.sender_host <> 'R' BEGIN "
    "UPDATE messages SET payload = json_set(payload, '$.message', 'rewritten by R') "
    "WHERE message_id = NEW.message_id; END"
)
PG_TRIGGER = (
    "CREATE FUNCTION ci_rewrite() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "NEW.payload := jsonb_set(NEW.payload::jsonb, '{message}', '\"rewritten by R\"')::json; "
    "RETURN NEW; END $$",
    "CREATE TRIGGER ci_rewrite BEFORE INSERT ON messages FOR EACH ROW "
    "WHEN (NEW.sender_host <> 'R') EXECUTE FUNCTION ci_rewrite()",
)


def _install_trigger(store_url: str, backend: str) -> None:
    if backend == "sqlite":
        db = sqlite3.connect(str(make_url(store_url).database), timeout=30)
        try:
            with db:
                db.execute(SQLITE_TRIGGER)
        finally:
            db.close()
        return
    engine = create_engine(store_url)
    try:
        with engine.begin() as conn:
            for stmt in PG_TRIGGER:
                conn.execute(text(stmt))
    finally:
        engine.dispose()


def test_rewritten_message_refused_by_digest(
    cluster: Cluster, store_url: str, backend: str
) -> None:
    a, b = cluster.up("A", "B", A={"remote_ack_wait_s": 10})
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")
    assert planner.send("worker@B", "before the trigger").outcome.value == "delivered"

    _install_trigger(store_url, backend)
    sent = planner.send("worker@B", "the original text")
    assert sent.outcome.value == "refused", sent
    assert delivery_reasons(store_url, [sent.id]) == {sent.id: ("refused", "bad_message")}
    assert sent.id not in worker.message_ids()
    assert sent.id not in b.inbox("worker")
    log = b.relay_log()
    assert f"inbound row {sent.id} from A refused" in log
    assert "does not match the digest its sender stored" in log
    assert b.relay is not None and b.relay.poll() is None


def test_relay_names_a_foreign_trigger_and_a_world_readable_store_at_start(
    sqlite_cluster: Cluster, sqlite_store: str
) -> None:
    _install_trigger(sqlite_store, "sqlite")
    db = Path(str(make_url(sqlite_store).database))
    db.chmod(0o644)
    (b,) = sqlite_cluster.up("B")
    log = b.relay_log()
    assert "trigger the schema does not define: 'ci_rewrite'" in log
    assert f"{db} is readable by every local user (mode 644)" in log

    def shown() -> str:
        store: str = b.cli_json("status", "--json")["relay"].get("store") or ""
        return store if "ci_rewrite" in store and "every local user" in store else ""

    wait_for(shown, 20, "status to name the trigger and the file's mode")


def test_fresh_store_has_no_trust_warnings(sqlite_cluster: Cluster) -> None:
    (b,) = sqlite_cluster.up("B")
    wait_for(lambda: b.cli_json("status", "--json")["relay"].get("store"), 20, "the relay line")
    for said in (b.relay_log(), b.cli_json("status", "--json")["relay"]["store"]):
        assert "the schema does not define" not in said
        assert "by every local user" not in said
