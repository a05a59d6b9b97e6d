"""Per-host database roles with row-level security (PostgreSQL, storage/schema/postgres.sql).

Each test host gets its own role through `crossintercom db grant-host`; the attacks connect as
one host's role and try to read, forge and change another host's rows, through the store API
and in plain SQL. The legitimate paths (claim, roster, enqueue, fetch, ack, receipts, expiry,
purge) keep working under the same roles.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from sqlalchemy.engine import make_url

from crossintercom.errors import StoreError
from crossintercom.models import Message, Peer, SessionInfo
from crossintercom.storage import (
    Ack,
    ArchiveEntry,
    ArchiveRecipient,
    MailboxStore,
    OutboundItem,
    ReceiptUpdate,
    open_store,
)
from crossintercom.storage.blocking import run
from crossintercom.storage.roles import role_name
from tests.archive_sync import SyncArchive
from tests.hostroles import drop_host_roles
from tests.pgharness import PgServer
from tests.storage.conftest import run_python

pytestmark = pytest.mark.pg
PASSWORD = "r0le-Pa55"


@dataclass
class HostRole:
    host: str
    role: str
    url: str  # the store URL that connects as the role

    def libpq(self) -> str:
        return self.url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def hosts(pg_server: PgServer, pg_url: str) -> Iterator[dict[str, HostRole]]:
    """Hosts A, B and C, each granted its own role by the CLI (run twice: it updates)."""
    suffix = uuid.uuid4().hex[:6]
    out: dict[str, HostRole] = {}
    for name in ("A", "B", "C"):
        host = f"{name}-{suffix}"
        for _ in range(2):
            proc = run_python(
                "-m", "crossintercom", "db", "grant-host", host, "--store", pg_url,
                "--password-stdin", input=PASSWORD + "\n",
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            assert PASSWORD not in proc.stdout + proc.stderr
        role = role_name(host, make_url(pg_url).database or "")
        assert role in proc.stdout
        url = make_url(pg_url).set(username=role, password=PASSWORD)
        out[name] = HostRole(host, role, url.render_as_string(hide_password=False))
    try:
        yield out
    finally:
        drop_host_roles(pg_server, [h.role for h in out.values()], pg_url)


def item(mid: str, sender: str, recipient: str, session: str = "s1") -> OutboundItem:
    return OutboundItem(mid, sender, recipient, session, "d" * 64, {"id": mid}, 1)


def test_grant_host_refuses_sqlite(tmp_path: object) -> None:
    proc = run_python(
        "-m", "crossintercom", "db", "grant-host", "A", "--store", f"sqlite:///{tmp_path}/x.db"
    )
    assert proc.returncode == 1
    assert "need PostgreSQL" in proc.stderr and "Traceback" not in proc.stderr


def test_a_host_role_keeps_to_its_own_rows(hosts: dict[str, HostRole]) -> None:
    a, b, c = hosts["A"], hosts["B"], hosts["C"]
    sa: MailboxStore = run(open_store(a.url))
    sb: MailboxStore = run(open_store(b.url))
    sc: MailboxStore = run(open_store(c.url))
    try:
        gen_a, gen_b, gen_c = (
            run(sa.claim_host(a.host)),
            run(sb.claim_host(b.host)),
            run(sc.claim_host(c.host)),
        )
        assert run(sa.publish_sessions(a.host, gen_a, [SessionInfo(id="sa", host=a.host)]))
        assert run(sb.publish_sessions(b.host, gen_b, [SessionInfo(id="s1", host=b.host)]))
        # legitimate traffic: A -> B, and B -> C (which A must never see)
        [ok] = run(sa.enqueue([item("a-to-b", a.host, b.host)], generation=gen_a))
        assert (ok.state, ok.inserted) == ("queued", True)
        run(sb.enqueue([item("b-to-c", b.host, c.host)], generation=gen_b))

        # forging: A writes as B, claims B, publishes B's roster
        with pytest.raises(StoreError, match="row-level security"):
            run(sa.enqueue([item("forged", b.host, c.host)]))
        with pytest.raises(StoreError, match="row-level security"):
            run(sa.claim_host(b.host))
        assert run(sa.publish_sessions(b.host, gen_b, [])) is False
        assert run(sa.heartbeat(b.host, gen_b)) is False
        assert run(sa.fetch_inbound(c.host, gen_c)) == []
        # a message id B already used is refused to A, without revealing its content
        [taken] = run(sa.enqueue([item("b-to-c", a.host, c.host)]))
        assert (taken.state, taken.code) == ("refused", "id_conflict")
        assert run(sa.get_message("b-to-c")) is None

        # the roster and the leases are readable by everyone
        assert {s.host for s in run(sa.roster())} == {a.host, b.host}
        assert {h.host_id for h in run(sa.hosts())} >= {a.host, b.host, c.host}

        # the recipient reads and acks; the sender gets the receipt
        [row] = run(sb.fetch_inbound(b.host, gen_b))
        assert (row.message_id, row.sender_host) == ("a-to-b", a.host)
        assert run(sb.ack(b.host, gen_b, [Ack("a-to-b", "s1", "delivered")])) == 1
        [receipt] = run(sa.receipts(a.host, gen_a))
        assert (receipt.message_id, receipt.outcome) == ("a-to-b", "delivered")
        run(sa.consume_receipts(a.host, gen_a, [receipt.id]))
        assert run(sa.receipts(a.host, gen_a)) == []
        # housekeeping runs under a host role without touching others' rows
        run(sa.expire())
        run(sa.purge())
        [row_c] = run(sc.fetch_inbound(c.host, gen_c))
        assert row_c.message_id == "b-to-c"
    finally:
        for s in (sa, sb, sc):
            run(s.aclose())


def test_plain_sql_attacks_as_a_host_role(hosts: dict[str, HostRole]) -> None:
    a, b, c = hosts["A"], hosts["B"], hosts["C"]
    sb = run(open_store(b.url))
    try:
        gen_b = run(sb.claim_host(b.host))
        run(sb.publish_sessions(b.host, gen_b, [SessionInfo(id="victim", host=b.host)]))
        run(sb.enqueue([item("secret", b.host, c.host, "s9")]))
    finally:
        run(sb.aclose())
    with psycopg.connect(a.libpq(), autocommit=True) as conn:
        # read another host's mail
        assert conn.execute("SELECT count(*) FROM messages").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM deliveries").fetchone() == (0,)
        # finish, steal or reroute another host's deliveries, take over its lease or roster
        for stmt in (
            "UPDATE deliveries SET state = 'delivered' WHERE message_id = 'secret'",
            "DELETE FROM deliveries WHERE message_id = 'secret'",
            f"UPDATE hosts SET generation = generation + 1 WHERE host_id = '{b.host}'",
            f"DELETE FROM roster WHERE host_id = '{b.host}'",
            "DELETE FROM receipts",
        ):
            assert conn.execute(stmt).rowcount == 0, stmt
        # write rows as another host, or rewrite columns no operation of a host changes
        for stmt in (
            f"UPDATE deliveries SET recipient_host = '{a.host}' WHERE message_id = 'secret'",
            f"UPDATE roster SET name = 'x' WHERE host_id = '{b.host}'",
            # its own lease time is the store's to stamp (a trigger), never a host's
            f"UPDATE hosts SET beat_at = now() + interval '1 day' WHERE host_id = '{a.host}'",
            f"INSERT INTO roster (host_id, session_id, purpose, groups, durable, online) "
            f"VALUES ('{b.host}', 'evil', 'agent', '[]', false, true)",
            f"INSERT INTO messages (message_id, sender_host, digest, payload, size, created) "
            f"VALUES ('evil', '{b.host}', 'x', '{{}}', 1, now())",
            f"INSERT INTO receipts (sender_host, message_id, recipient_session, recipient_host, "
            f"outcome, created) VALUES ('{c.host}', 'secret', 's9', '{b.host}', 'delivered', "
            f"now())",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)
        # the role map and the store settings are the admin's alone
        for stmt in (
            f"INSERT INTO host_roles VALUES ('{a.role}', '{b.host}')",
            f"UPDATE host_roles SET host_id = '{b.host}'",
            "UPDATE settings SET max_message_bytes = 1",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)
    # nothing of B's changed
    with psycopg.connect(b.libpq(), autocommit=True) as conn:
        assert conn.execute(
            "SELECT state FROM deliveries WHERE message_id = 'secret'"
        ).fetchone() == ("queued",)
        assert conn.execute(
            "SELECT session_id FROM roster WHERE host_id = %s", (b.host,)
        ).fetchall() == [("victim",)]


def test_a_host_role_reads_receipts_instead_of_taking_hinted_ones(
    hosts: dict[str, HostRole],
) -> None:
    """Any role may NOTIFY: under per-host roles a receipt in a hint is only "read them"."""
    a, b = hosts["A"], hosts["B"]
    sa: MailboxStore = run(open_store(a.url))
    sb: MailboxStore = run(open_store(b.url))
    try:
        gen_a, gen_b = run(sa.claim_host(a.host)), run(sb.claim_host(b.host))
        run(sa.enqueue([item("hinted", a.host, b.host)], generation=gen_a))
        with sa.waiter(a.host) as waiter:
            assert waiter.wake(1.0) is not None  # the catch-up
            assert run(sb.ack(b.host, gen_b, [Ack("hinted", "s1", "delivered")])) == 1
            woke = waiter.wake(5.0)
            assert woke is not None and woke.receipts and not woke.hinted
        [receipt] = run(sa.receipts(a.host, gen_a))
        assert (receipt.message_id, receipt.outcome) == ("hinted", "delivered")
    finally:
        run(sa.aclose())
        run(sb.aclose())


def test_a_host_roles_heartbeat_answers_without_the_archive(hosts: dict[str, HostRole]) -> None:
    """The archive's tables are the admin's: the beat leaves its setting out (None)."""
    a = hosts["A"]
    sa: MailboxStore = run(open_store(a.url))
    try:
        gen = run(sa.claim_host(a.host))
        beat = run(sa.beat(a.host, gen, ["s1"]))
        assert beat is not None and beat.archive_enabled is None
        assert a.host in {h.host_id for h in beat.hosts}
    finally:
        run(sa.aclose())


def test_a_host_role_can_write_no_archive_receipt(hosts: dict[str, HostRole], pg_url: str) -> None:
    """The archive is the admin's (docs/archive.md): a host role may not move a receipt of its
    own recipients either, through the archive's writer or in plain SQL, nor read one."""
    admin = SyncArchive(pg_url)
    try:
        msg = Message("archived", Peer("sid-b", "bob", hosts["B"].host), "carol", "hi")
        recipient = ArchiveRecipient("sid-c", hosts["C"].host, "delivered", "carol")
        admin.archive([ArchiveEntry(msg, (recipient,))])
    finally:
        admin.close()
    c = hosts["C"]
    as_c = SyncArchive(c.url)
    try:
        with pytest.raises(StoreError):
            as_c.archive([ReceiptUpdate("archived", "sid-c", c.host, "shown")])
    finally:
        as_c.close()
    with psycopg.connect(c.libpq(), autocommit=True) as conn:
        for stmt in (
            "UPDATE archive_recipients SET outcome = 'shown'",
            "SELECT outcome FROM archive_recipients",
            "UPDATE archive_messages SET payload = '{}'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)
    check = SyncArchive(pg_url)
    try:
        assert [r.outcome for r in check.receipts_of(["archived"])["archived"]] == ["delivered"]
    finally:
        check.close()
