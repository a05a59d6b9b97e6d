"""What a session says of itself reaches every `list` answer of every host, through the store's
roster: a host that publishes rows no broker would have let a session describe itself (a
megabyte status, a name that is no name, endless groups) has those rows left out by every
reader, and the rest of the roster stays readable (docs/protocol.md, "register")."""

from __future__ import annotations

import pytest

from crossintercom.models import CWD_CHARS, DESCRIPTION_CHARS, MAX_GROUPS, SessionInfo
from crossintercom.storage import MailboxStore, open_store
from crossintercom.storage.blocking import run


def test_rows_over_their_bounds_are_left_out(store: MailboxStore) -> None:
    gen = run(store.claim_host("a"))
    fine = SessionInfo(
        id="fine",
        host="a",
        name="n" * 64,
        cwd="/" * CWD_CHARS,
        model="m" * DESCRIPTION_CHARS,
        status="s" * DESCRIPTION_CHARS,
        groups=tuple(f"g{i}" for i in range(MAX_GROUPS)),
    )
    hostile = [
        SessionInfo(id="status", host="a", status="s" * (DESCRIPTION_CHARS + 1)),
        SessionInfo(id="model", host="a", model="m" * 5_000_000),
        SessionInfo(id="cwd", host="a", cwd="/" * (CWD_CHARS + 1)),
        SessionInfo(id="name", host="a", name="two\nlines"),
        SessionInfo(id="groups", host="a", groups=tuple(f"g{i}" for i in range(MAX_GROUPS + 1))),
        SessionInfo(id="group-name", host="a", groups=("ok", "not a name")),
    ]
    assert run(store.publish_sessions("a", gen, [fine, *hostile]))
    assert [s.id for s in run(store.roster())] == ["fine"]
    assert run(store.roster())[0] == fine


def test_a_session_id_no_client_could_register_is_left_out(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite keeps a session id of any length (PostgreSQL's column refuses one over 64): a
    megabyte id in every `list` answer is as unreadable as a megabyte status, and in the log
    that names the row left out as well."""
    store = run(open_store(sqlite_url))
    try:
        gen = run(store.claim_host("a"))
        rows = [SessionInfo(id="i" * 1_000_000, host="a"), SessionInfo(id="fine", host="a")]
        assert run(store.publish_sessions("a", gen, rows))
        assert [s.id for s in run(store.roster())] == ["fine"]
    finally:
        run(store.aclose())
    (left_out,) = [r for r in caplog.records if r.getMessage().startswith("roster rows left out")]
    assert len(str(left_out.__dict__["sessions"])) < 1000


def test_a_host_publishing_endless_rows_is_read_bounded(
    store: MailboxStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A host may publish any number of its own rows, each within bounds (its role's right on
    PostgreSQL): other hosts read its first ``per_host`` (by session id) and say so, and every
    other host's rows stay whole."""
    flood, other = run(store.claim_host("flood")), run(store.claim_host("b"))
    rows = [SessionInfo(id=f"s{i:05}", host="flood", cwd="/" * 600) for i in range(3000)]
    assert run(store.publish_sessions("flood", flood, rows))
    assert run(store.publish_sessions("b", other, [SessionInfo(id="sb", host="b")]))
    read = run(store.roster(per_host=1000))
    assert [s.id for s in read if s.host == "flood"] == [f"s{i:05}" for i in range(1000)]
    assert [s.id for s in read if s.host == "b"] == ["sb"]
    assert any("hosts with more than 1000" in r.getMessage() for r in caplog.records)
