"""The archive on both backends: store-wide setting, batched copies, ranked full-text search
with snippets and filters, queries full of SQL and full-text syntax, threads, flow, retention.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from sqlalchemy import text

from crossintercom.models import Message, Peer
from crossintercom.search_model import MARK_END, MARK_START, SearchQuery
from crossintercom.storage import ArchiveEntry, ArchiveRecipient
from crossintercom.storage import engine as db
from crossintercom.storage.urls import parse_store_url
from tests.archive_sync import SyncArchive

FILLER = [
    "lunch menu for friday",
    "the build cache was cleared",
    "weekly status: nothing unusual",
    "rotate the staging certificates",
    "coffee machine is broken again",
    "new intern starts monday",
    "dependency update for the parser",
    "flaky test in the scheduler",
    "review the onboarding document",
    "calendar invite for the retro",
]


def msg(
    mid: str,
    text_: str,
    *,
    name: str = "alice",
    host: str = "hostA",
    to: str = "bob",
    subject: str | None = None,
    thread: str | None = None,
    sent_at: str | None = None,
) -> Message:
    m = Message(mid, Peer(f"sid-{name}", name, host), to, text_, subject=subject, thread_id=thread)
    return msgspec.structs.replace(m, sent_at=sent_at) if sent_at else m


def to(name: str, host: str, outcome: str = "delivered") -> tuple[ArchiveRecipient, ...]:
    return (ArchiveRecipient(f"sid-{name}", host, outcome, name),)


def fill(archive: SyncArchive) -> None:
    archive.archive(
        [ArchiveEntry(msg(f"f{i}", t), to("bob", "hostB")) for i, t in enumerate(FILLER)]
    )


def test_the_archive_is_off_until_turned_on_and_keeps_its_retention(
    archive: SyncArchive,
) -> None:
    assert not archive.archive_settings().enabled
    on = archive.set_archive(enabled=True, retention_s=3600)
    assert (on.enabled, on.retention_s) == (True, 3600)
    assert archive.archive_settings() == on
    off = archive.set_archive(enabled=False)
    assert (off.enabled, off.retention_s) == (False, 3600)


def test_ranking_puts_the_better_match_first_and_snippets_mark_the_words(
    archive: SyncArchive,
) -> None:
    fill(archive)
    archive.archive(
        [
            ArchiveEntry(msg("once", "we could deploy the billing service later"), to("bob", "B")),
            ArchiveEntry(
                msg(
                    "often",
                    "deploy billing now: the billing deploy failed, billing deploy again",
                    subject="billing deploy",
                ),
                to("bob", "B"),
            ),
        ]
    )
    hits = archive.search(SearchQuery("billing deploy"))
    assert [h.message.id for h in hits] == ["often", "once"]
    assert hits[0].score > hits[1].score
    for h in hits:
        assert f"{MARK_START}billing{MARK_END}" in h.snippet.lower()
    # Stemming on both engines: "deploying" finds "deploy".
    assert {h.message.id for h in archive.search(SearchQuery("deploying"))} == {"often", "once"}
    assert archive.search(SearchQuery("nonexistentword")) == []


@pytest.mark.parametrize(
    "query",
    [
        "'; DROP TABLE archive_messages; --",
        'unbalanced "quote',
        "NEAR(deploy billing) AND OR NOT *",
        "deploy:* & !billing | (x",
        "100% _under_ \\ back\\slash",
        "^caret {braces} [brackets] col:umn",
    ],
)
def test_queries_full_of_sql_and_full_text_syntax_are_only_words(
    archive: SyncArchive, store_url: str, query: str
) -> None:
    fill(archive)
    archive.archive([ArchiveEntry(msg("odd", query + " marker"), to("bob", "hostB"))])
    hits = archive.search(SearchQuery(query + " marker"))
    assert [h.message.id for h in hits] == ["odd"]
    # The tables are all still there.
    engine = db.store_engine(parse_store_url(store_url))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM archive_messages")).scalar() == 11
    finally:
        engine.dispose()


def test_only_punctuation_finds_nothing(archive: SyncArchive) -> None:
    fill(archive)
    assert archive.search(SearchQuery("'\"*()-:")) == []


def test_filters_sender_recipient_host_thread_and_since(archive: SyncArchive) -> None:
    old = (datetime.now(UTC) - timedelta(days=10)).isoformat().replace("+00:00", "Z")
    archive.archive(
        [
            ArchiveEntry(msg("a1", "release notes", subject="release"), to("bob", "hostB")),
            ArchiveEntry(
                msg("b1", "release looks good", name="bob", host="hostB", to="alice", thread="a1"),
                to("alice", "hostA"),
            ),
            ArchiveEntry(
                msg("c1", "release on hostC", name="carol", host="hostC", to="dave"),
                to("dave", "hostC"),
            ),
            ArchiveEntry(msg("old", "release from long ago", sent_at=old), to("bob", "hostB")),
        ]
    )

    def ids(**kw: object) -> set[str]:
        return {h.message.id for h in archive.search(SearchQuery("release", **kw))}  # type: ignore[arg-type]

    assert ids() == {"a1", "b1", "c1", "old"}
    assert ids(sender="bob") == {"b1"}
    assert ids(sender="bob@hostB") == {"b1"}
    assert ids(sender="sid-carol") == {"c1"}
    assert ids(recipient="dave") == {"c1"}
    assert ids(recipient="alice@hostA") == {"b1"}
    assert ids(host="hostC") == {"c1"}
    assert ids(host="hostB") == {"a1", "b1", "old"}  # sent from it or delivered to it
    assert ids(thread="a1") == {"a1", "b1"}
    assert ids(since=datetime.now(UTC) - timedelta(days=1)) == {"a1", "b1", "c1"}


def test_copies_from_both_hosts_keep_one_message_and_the_best_receipt(
    archive: SyncArchive,
) -> None:
    m = msg("m1", "hello across hosts", subject="greeting")
    # The sender's host saw it queued; the recipient's host then delivered it; a late copy of
    # the sender's view must not undo that.
    archive.archive([ArchiveEntry(m, to("bob", "hostB", "queued"))])
    archive.archive([ArchiveEntry(m, to("bob", "hostB", "delivered"))])
    archive.archive([ArchiveEntry(m, to("bob", "hostB", "queued"))])
    [row] = archive.feed(0)
    assert row.message == m
    assert [(r.name, r.host_id, r.outcome) for r in row.recipients] == [
        ("bob", "hostB", "delivered")
    ]
    assert len(archive.search(SearchQuery("hello"))) == 1


def test_threads_feed_and_flow(archive: SyncArchive) -> None:
    archive.archive(
        [
            ArchiveEntry(msg("root", "shall we ship?", subject="ship it"), to("bob", "hostB")),
            ArchiveEntry(
                msg("r1", "yes", name="bob", host="hostB", to="alice", thread="root"),
                to("alice", "hostA"),
            ),
            ArchiveEntry(msg("local", "same host", to="carol"), to("carol", "hostA")),
        ]
    )
    assert [r.message.id for r in archive.thread("root")] == ["root", "r1"]
    [latest, first] = archive.threads()[:2]
    assert (first.thread_id, first.subject, first.messages) == ("root", "ship it", 2)
    assert latest.thread_id == "local"
    rows = archive.feed(0)
    assert [r.message.id for r in rows] == ["root", "r1", "local"]
    assert [r.message.id for r in archive.feed(rows[0].seq)] == ["r1", "local"]
    flow = {(e.sender_host, e.recipient_host): e.messages for e in archive.flow()}
    assert flow == {("hostA", "hostB"): 1, ("hostB", "hostA"): 1, ("hostA", "hostA"): 1}


def test_retention_purges_old_copies_and_their_index_entries(
    archive: SyncArchive, store_url: str
) -> None:
    archive.set_archive(enabled=True, retention_s=3600)
    archive.archive([ArchiveEntry(msg("old", "ancient history"), to("bob", "hostB"))])
    engine = db.store_engine(parse_store_url(store_url))
    try:
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE archive_messages SET archived_at = :t"),
                {"t": datetime.now(UTC) - timedelta(hours=2)},
            )
    finally:
        engine.dispose()
    archive.archive([ArchiveEntry(msg("new", "recent history"), to("bob", "hostB"))])
    assert archive.purge_archive() == 1
    assert [h.message.id for h in archive.search(SearchQuery("history"))] == ["new"]
    assert [r.message.id for r in archive.feed(0)] == ["new"]
