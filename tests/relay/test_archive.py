"""Threads and the archive across two simulated hosts (docs/threads.md, docs/archive.md):
subjects and threads travel with messages; with the archive off, nothing is copied and search
reads this host's inboxes; with it on, relays copy every message (same-host ones too) and
`search` on one host finds what the other sent last; a broken or slow archive never delays or
fails a delivery.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import text

from crossintercom.models import Outcome
from crossintercom.storage import engine as db
from crossintercom.storage.urls import parse_store_url
from tests.archive_sync import SyncArchive
from tests.conftest import background_cli
from tests.relay.conftest import Cluster, Host, wait_for


def archived_ids(store_url: str) -> set[str]:
    archive = SyncArchive(store_url)
    try:
        return {r.message.id for r in archive.feed(0)}
    finally:
        archive.close()


def execute(store_url: str, *statements: str) -> None:
    engine = db.store_engine(parse_store_url(store_url))
    try:
        with engine.begin() as conn:
            for s in statements:
                conn.execute(text(s))
    finally:
        engine.dispose()


def turn_archive_on(host: Host) -> None:
    out = host.cli_json("archive", "on", "--retention", "30d")
    assert out == {"enabled": True, "retention_s": 30 * 86400}


def test_subjects_and_threads_across_hosts_and_inbox_by_thread(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    worker = b.listen("worker")
    a.listen("planner")
    a.wait_sees("worker", "B")
    b.wait_sees("planner", "A")

    with background_cli(
        a.env,
        "ask",
        "--as",
        "planner",
        "--to",
        "worker",
        "--subject",
        "release 1.2",
        "--timeout",
        "60",
        "--json",
        "ready to ship?",
    ) as ask:
        question = worker.next_message()
        assert question["subject"] == "release 1.2"
        assert question["thread_id"] == question["id"]  # a new message is its thread's root
        assert b.cli_json("reply", "--as", "worker", "yes")["outcome"] == "delivered"
        out, err = ask.communicate(timeout=60)
    assert ask.returncode == 0, (out, err)
    reply = json.loads(out)["reply"]
    # The reply joins the ask's thread and keeps its subject.
    assert reply["thread_id"] == question["id"]
    assert reply["subject"] == "release 1.2"

    follow = a.cli_json(
        "send", "--as", "planner", "--to", "worker", "--thread", question["id"], "shipped"
    )
    other = a.cli_json("send", "--as", "planner", "--to", "worker", "unrelated")
    got = worker.next_message()
    assert (got["id"], got["thread_id"], got["subject"]) == (follow["id"], question["id"], None)
    worker.next_message()
    in_thread = b.cli_json("inbox", "--as", "worker", "--thread", question["id"])
    assert [m["id"] for m in in_thread] == [question["id"], follow["id"]]
    assert other["id"] not in {m["id"] for m in in_thread}
    text_out = b.cli("inbox", "--as", "worker", "--thread", question["id"]).stdout
    assert "Subject: release 1.2" in text_out


def test_archive_off_copies_nothing_and_search_reads_this_hosts_inboxes(
    cluster: Cluster, store_url: str
) -> None:
    a, b = cluster.up("A", "B")
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    sent = a.cli_json("send", "--as", "planner", "--to", "worker", "the zebra migration is done")
    worker.next_message()
    assert a.cli_json("archive", "status") == {"enabled": False, "retention_s": 30 * 86400}

    # B received it: its inbox search finds it; A's inboxes never held it.
    [hit] = b.cli_json("search", "zebra")
    assert (hit["id"], hit["source"]) == (sent["id"], "inbox")
    assert "\u00abzebra\u00bb" in hit["snippet"]
    assert a.cli_json("search", "zebra") == []
    assert "nothing in the inboxes on A" in a.cli("search", "zebra").stdout
    assert archived_ids(store_url) == set()


def test_archive_on_search_finds_what_the_other_host_sent_last_same_host_included(
    cluster: Cluster, store_url: str
) -> None:
    a, b = cluster.host("A", relay=False), cluster.host("B", relay=False)
    turn_archive_on(a)
    a.start_relay()
    b.start_relay()
    worker, planner, local = b.listen("worker"), a.listen("planner"), a.listen("local")
    a.wait_sees("worker", "B")
    b.wait_sees("planner", "A")

    first = a.cli_json("send", "--as", "planner", "--to", "worker", "--subject", "quokka", "hi")
    worker.next_message()
    same_host = a.cli_json("send", "--as", "planner", "--to", "local", "quokka next door")
    local.next_message()
    last = b.cli_json("send", "--as", "worker", "--to", "planner@A", "quokka report attached")
    planner.next_message()

    wanted = {first["id"], same_host["id"], last["id"]}
    wait_for(lambda: wanted <= archived_ids(store_url), 20, "the archive to hold all three")
    hits = a.cli_json("search", "quokka")
    assert {h["id"] for h in hits} == wanted
    assert {h["source"] for h in hits} == {"archive"}
    from_b = a.cli_json("search", "quokka", "--from", "worker@B")
    assert [h["id"] for h in from_b] == [last["id"]]
    assert [h["id"] for h in a.cli_json("search", "quokka", "--host", "B")] != []
    assert a.cli_json("search", "report", "--since", "1h")[0]["id"] == last["id"]
    assert a.cli_json("search", "report", "--since", "2000-01-01")[0]["id"] == last["id"]
    text_out = a.cli("search", "quokka", "--thread", first["id"]).stdout
    assert "Subject: quokka" in text_out and first["id"] in text_out

    # The recipient's host reports delivery, then that its listener showed it, whichever copy
    # arrived first; never back to the sender's host's view.
    archive = SyncArchive(store_url)
    try:

        def recipients() -> list[tuple[str | None, str, str]]:
            row = next(r for r in archive.feed(0) if r.message.id == first["id"])
            return [(r.name, r.host_id, r.outcome) for r in row.recipients]

        wait_for(lambda: recipients() == [("worker", "B", "shown")], 20, "shown archived")
    finally:
        archive.close()


def test_search_usage_errors_have_codes(cluster: Cluster) -> None:
    [a] = cluster.up("A")
    for args in (["search", "'\"*"], ["search", "x", "--since", "yesterday"]):
        out = a.cli(*args, "--json")
        assert out.returncode == 2, out
        assert json.loads(out.stdout)["error"]["code"] == "invalid_argument"
    assert a.cli("archive", "on", "--retention", "0d").returncode == 2


def test_a_failing_archive_never_delays_or_fails_delivery(cluster: Cluster, store_url: str) -> None:
    a, b = cluster.host("A", relay=False), cluster.host("B", relay=False)
    turn_archive_on(a)
    # Break the archive: its table is gone, so every batch the relays write fails.
    execute(store_url, "ALTER TABLE archive_messages RENAME TO archive_messages_gone")
    a.start_relay()
    b.start_relay()
    worker = b.listen("worker")
    a.listen("local")  # a same-host recipient, so same-host copies are made too
    a.wait_sees("worker", "B")
    # How long a send takes is the bench's to say; that it is delivered is checked here (the
    # stalled-archive test shows delivery does not wait for the archive).
    for i in range(5):
        out = a.cli_json("send", "--as", "planner", "--to", "worker", f"still works {i}")
        assert out["outcome"] == "delivered", out
        assert worker.next_message()["message"] == f"still works {i}"
        out = a.cli_json("send", "--as", "planner", "--to", "local", f"here too {i}")
        assert out["outcome"] == "delivered", out
    wait_for(lambda: "archive write failed" in a.relay_log(), 20, "the relay to log the failure")
    assert a.relay is not None and a.relay.poll() is None  # and it keeps running


@contextmanager
def table_locked(store_url: str) -> Iterator[None]:
    """Hold an exclusive lock on the archive table: every archive write waits behind it."""
    dsn = store_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        conn.execute("LOCK TABLE archive_messages IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


@pytest.fixture
def pg_cluster(pg_url: str) -> Iterator[Cluster]:
    c = Cluster(pg_url)
    try:
        yield c
    finally:
        c.close()


@pytest.mark.pg
def test_a_stalled_archive_never_holds_delivery(pg_cluster: Cluster, pg_url: str) -> None:
    """Messages are delivered while the archive's table is locked: the archive runs on the
    relay's one statement connection, and its writes give up on the lock after its lock
    timeout (queries.ARCHIVE_LOCK_TIMEOUT_MS) rather than hold that connection; the copies are
    dropped and logged, the relay keeps running, and once the lock goes copies are written
    again. No archive statement stays waiting on the lock (how fast delivery goes is the
    bench's to say). Postgres only: a lock stalls archive writers there without blocking the
    whole store (on SQLite any writer holds the one file lock)."""
    cluster, store_url = pg_cluster, pg_url
    a, b = cluster.host("A", relay=False), cluster.host("B", relay=False)
    turn_archive_on(a)
    a.start_relay()
    b.start_relay()
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")

    def deliver(text: str) -> str:
        result = planner.send("worker@B", text)
        assert result.outcome is Outcome.DELIVERED, result
        assert worker.next_message()["message"] == text
        return result.id

    with table_locked(store_url):
        for i in range(5):
            deliver(f"stalled {i}")
        wait_for(
            lambda: "archive write failed" in a.relay_log() + b.relay_log(),
            30,
            "an archive write to give up on the lock",
        )
        # A statement seen waiting now is one younger than its lock timeout: it goes too.
        waiting = blocked_archive_statements(store_url)
        wait_for(
            lambda: not waiting & blocked_archive_statements(store_url),
            10,
            "the archive's waits to end by themselves",
        )
    assert a.relay is not None and a.relay.poll() is None
    after = deliver("after the lock")
    wait_for(lambda: after in archived_ids(store_url), 30, "the archive to write again")


def blocked_archive_statements(store_url: str) -> set[tuple[int, object]]:
    """(backend, statement start) of every statement waiting for a lock on the archive."""
    dsn = store_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT a.pid, a.query_start FROM pg_locks AS l "
            "JOIN pg_stat_activity AS a ON a.pid = l.pid "
            "WHERE NOT l.granted AND l.relation = 'archive_messages'::regclass "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    return {(pid, started) for pid, started in rows}
