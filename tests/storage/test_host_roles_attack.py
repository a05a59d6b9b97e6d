"""A compromised host attacks the store as its own role over a real connection (PostgreSQL,
per-host roles set up as docs/operations.md says): temporary objects that shadow what the
policy functions read, column rewrites, LISTEN on other hosts' channels, roster claims,
planted receipts, a second store on the same server, and locks that stall everyone. Every
attack is refused, confined to the attacker's own rows, or named."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from crossintercom.models import SessionInfo, durable_session_id, rightful_claims
from crossintercom.relay.stuck import describe
from crossintercom.storage import Ack, LateReceipt, MailboxStore, OutboundItem, open_store
from crossintercom.storage import queries as q
from crossintercom.storage.blocking import run
from crossintercom.storage.interface import MIGRATION_LOCK
from crossintercom.storage.migrate import upgrade
from crossintercom.storage.roles import grant_host
from crossintercom.storage.wakeup import ROSTER_CHANNEL, channel_name
from tests.hostroles import drop_host_roles, role_url
from tests.pgharness import PgServer, create_database, drop_database
from tests.storage.conftest import run_python

pytestmark = pytest.mark.pg
PASSWORD = "att4ck-r0le"
Conn = psycopg.Connection[tuple[object, ...]]


@dataclass
class Host:
    host: str
    role: str
    url: str
    store: MailboxStore
    gen: int

    def connect(self, **kw: object) -> Conn:
        libpq = self.url.replace("postgresql+psycopg://", "postgresql://")
        return psycopg.connect(libpq, autocommit=True, **kw)  # type: ignore[arg-type]


def _as_role(pg_url: str, role: str) -> str:
    return role_url(pg_url, role, PASSWORD)


def item(mid: str, sender: str, recipient: str, session: str, from_id: str) -> OutboundItem:
    payload = {"id": mid, "from": {"id": from_id, "host": sender}}
    return OutboundItem(mid, sender, recipient, session, "d" * 64, payload, 1)


@pytest.fixture
def hosts(pg_server: PgServer, pg_url: str) -> Iterator[dict[str, Host]]:
    """A (the attacker), B and C, each with its own role; B has sent A "to-a" and C "secret"
    (which A never sees), and published a roster."""
    suffix = uuid.uuid4().hex[:6]
    out: dict[str, Host] = {}
    try:
        for name in ("A", "B", "C"):
            host = f"{name}-{suffix}"
            role, _ = grant_host(pg_url, host, PASSWORD)
            url = _as_role(pg_url, role)
            store = run(open_store(url))
            out[name] = Host(host, role, url, store, run(store.claim_host(host)))
        a, b, c = out["A"], out["B"], out["C"]
        run(b.store.publish_sessions(b.host, b.gen, [SessionInfo(id="eph-b", host=b.host)]))
        run(b.store.enqueue([item("to-a", b.host, a.host, "sa", "bs")], generation=b.gen))
        run(b.store.enqueue([item("secret", b.host, c.host, "s9", "bs")], generation=b.gen))
        yield out
    finally:
        for h in out.values():
            run(h.store.aclose())
        drop_host_roles(pg_server, [h.role for h in out.values()], pg_url)


def _confined(conn: Conn, a: Host, b: Host) -> None:
    """A reads, finishes, forges and fences nothing of B's (tables named by schema: a
    temporary table of the same name hides the real one from the attacker's own statements)."""
    assert conn.execute("SELECT public.crossintercom_host()").fetchone() == (a.host,)
    one = "SELECT count(*) FROM public.{} WHERE message_id = 'secret'"
    assert conn.execute(one.format("messages")).fetchone() == (0,)
    assert conn.execute(one.format("deliveries")).fetchone() == (0,)
    for stmt in (
        "UPDATE public.deliveries SET state = 'delivered' WHERE message_id = 'secret'",
        f"UPDATE public.hosts SET generation = generation + 1 WHERE host_id = '{b.host}'",
        f"DELETE FROM public.roster WHERE host_id = '{b.host}'",
    ):
        assert conn.execute(stmt).rowcount == 0, stmt
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(
            "INSERT INTO public.messages (message_id, sender_host, digest, payload, size, "
            f"created) VALUES ('forged', '{b.host}', 'x', '{{}}', 1, now())"
        )


SHADOWS = {
    "host_roles table": [
        "CREATE TEMP TABLE host_roles (role_name text, host_id text)",
        "INSERT INTO host_roles VALUES (session_user, '{b}')",
    ],
    "host_roles view": [
        "CREATE TEMP VIEW host_roles AS SELECT session_user::text AS role_name, "
        "'{b}'::text AS host_id",
    ],
    "messages table": [
        "CREATE TEMP TABLE messages (message_id text, sender_host text, payload json)",
        "INSERT INTO messages VALUES ('secret', '{a}', '{{}}')",
    ],
    "deliveries table": [
        "CREATE TEMP TABLE deliveries (message_id text, recipient_host text, "
        "recipient_session text)",
        "INSERT INTO deliveries VALUES ('secret', '{a}', 's9')",
    ],
    "functions": [
        "CREATE FUNCTION pg_temp.crossintercom_host() RETURNS text LANGUAGE sql "
        "AS $$ SELECT '{b}'::text $$",
        "CREATE FUNCTION pg_temp.crossintercom_sender(mid text) RETURNS text LANGUAGE sql "
        "AS $$ SELECT '{a}'::text $$",
        "CREATE FUNCTION pg_temp.crossintercom_addressed(mid text) RETURNS boolean "
        "LANGUAGE sql AS $$ SELECT true $$",
    ],
}


def test_temporary_objects_cannot_stand_in_for_what_the_policies_read(
    hosts: dict[str, Host], pg_server: PgServer, pg_url: str
) -> None:
    a, b = hosts["A"], hosts["B"]
    # The documented set-up leaves a host role no temporary objects at all ...
    with a.connect() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE TEMP TABLE host_roles (role_name text, host_id text)")
    # ... and the policy functions hold even where an admin left TEMPORARY granted.
    database = make_url(pg_url).database or ""
    with pg_server.admin() as admin:
        admin.execute(
            sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
                sql.Identifier(database), sql.Identifier(a.role)
            )
        )
    for name, statements in SHADOWS.items():
        with a.connect() as conn:
            for stmt in statements:
                conn.execute(stmt.format(a=a.host, b=b.host))
            try:
                _confined(conn, a, b)
            except AssertionError as exc:
                raise AssertionError(f"shadowed by a temporary {name}: {exc}") from exc
    # A's own mail still flows: its view of its deliveries is its own.
    [row] = run(a.store.fetch_inbound(a.host, a.gen))
    assert row.message_id == "to-a"


def test_a_host_rewrites_no_column_its_operations_do_not_change(
    hosts: dict[str, Host],
) -> None:
    a = hosts["A"]
    refused = {
        "deliveries": {
            "message_id": "'secret'",
            "recipient_host": "'elsewhere'",
            "recipient_session": "'s9'",
            "seq": "seq + 1000",
            "expires_at": "now()",
        },
        "hosts": {"host_id": "'renamed'"},
        "roster": dict.fromkeys(("host_id", "session_id", "name", "online"), "NULL"),
        "messages": dict.fromkeys(("message_id", "sender_host", "payload"), "NULL"),
        "receipts": dict.fromkeys(("message_id", "code", "sender_host", "note"), "NULL"),
    }
    with a.connect() as conn:
        for table, columns in refused.items():
            for column, value in columns.items():
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(f"UPDATE {table} SET {column} = {value}")
        # the columns its operations change, on its own rows (a finish with its receipt, as
        # its ack writes them)
        with conn.transaction():
            finish = (
                "UPDATE deliveries SET state = 'delivered', reason = 'queued', "
                "finished_at = now() WHERE message_id = 'to-a'"
            )
            assert conn.execute(finish).rowcount == 1
            conn.execute(
                "INSERT INTO receipts (sender_host, message_id, recipient_session, "
                "recipient_host, outcome, code, created) VALUES (%s, 'to-a', 'sa', %s, "
                "'delivered', 'queued', now())",
                (hosts["B"].host, a.host),
            )
        beat = (
            f"UPDATE hosts SET generation = generation, heartbeat = heartbeat + 1, "
            f"machine = 'm', roster_rev = roster_rev + 1 WHERE host_id = '{a.host}'"
        )
        assert conn.execute(beat).rowcount == 1
        # a reason is a code, never free text (it becomes the sender's receipt)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE deliveries SET reason = 'call 555-0100' WHERE message_id = 'to-a'")
        assert conn.execute(
            "SELECT count(*) FROM messages WHERE message_id = 'secret'"
        ).fetchone() == (0,)


def test_listening_on_other_hosts_channels_names_nothing(hosts: dict[str, Host]) -> None:
    a, b, c = hosts["A"], hosts["B"], hosts["C"]
    with a.connect() as spy:
        for channel in (channel_name(b.host), channel_name(c.host), ROSTER_CHANNEL):
            spy.execute(q.pg_listen(channel))
        # traffic between B and C: a delivery, an ack and its receipt, a late receipt, a roster
        run(b.store.enqueue([item("b-to-c", b.host, c.host, "s9", "bs")], generation=b.gen))
        assert run(c.store.ack(c.host, c.gen, [Ack("b-to-c", "s9", "delivered")])) == 1
        late = LateReceipt("b-to-c", "s9", b.host, "bs", "shown")
        assert run(c.store.add_receipts(c.host, c.gen, [late])) == 1
        run(b.store.publish_sessions(b.host, b.gen, [SessionInfo(id="eph-b2", host=b.host)]))
        payloads: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not {"d", "r", "o"} <= set(payloads):
            payloads += [n.payload for n in spy.notifies(timeout=1, stop_after=1)]
    assert {"d", "r", "o"} <= set(payloads), payloads
    assert set(payloads) <= {"d", "r", "o", ""}, payloads


def test_a_session_id_belongs_to_the_host_that_claimed_it(
    hosts: dict[str, Host], tmp_path: Path
) -> None:
    a, b, c = hosts["A"], hosts["B"], hosts["C"]
    # another host's session id, through the store API and in plain SQL
    assert run(a.store.publish_sessions(a.host, a.gen, [SessionInfo(id="eph-b", host=a.host)]))
    assert [(s.id, s.host) for s in run(a.store.roster()) if s.id == "eph-b"] == [("eph-b", b.host)]
    with a.connect() as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO roster (host_id, session_id, purpose, groups, durable, online) "
            f"VALUES ('{a.host}', 'eph-b', 'agent', '[]', false, true)"
        )
    # a durable id C's "worker" derives, claimed by A first: the store keeps the first claim,
    # every receiver drops it (it is not A's to derive), and C's other sessions still publish
    stolen = durable_session_id(c.host, "worker")
    fake = SessionInfo(id=stolen, host=a.host, name="worker", durable=True)
    assert run(a.store.publish_sessions(a.host, a.gen, [fake]))
    mine = SessionInfo(id=stolen, host=c.host, name="worker", durable=True)
    other = SessionInfo(id="eph-c", host=c.host)
    assert run(c.store.publish_sessions(c.host, c.gen, [mine, other]))
    kept, dropped = rightful_claims(run(c.store.roster()))
    assert {s.id for s in kept} == {"eph-b", "eph-c"}
    assert [(s.id, s.host) for s in dropped] == [(stolen, a.host)]
    # one id under two hosts (a store written before the unique index): neither wins
    twice = [SessionInfo(id="x", host=a.host), SessionInfo(id="x", host=b.host)]
    assert rightful_claims(twice) == ([], twice)
    assert rightful_claims(list(reversed(twice)))[0] == []
    # SQLite holds the same rule
    sqlite_url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(sqlite_url)
    sqlite = run(open_store(sqlite_url))
    try:
        for h in (a.host, b.host):
            gen = run(sqlite.claim_host(h))
            assert run(sqlite.publish_sessions(h, gen, [SessionInfo(id="same", host=h)]))
        assert [s.host for s in run(sqlite.roster())] == [a.host]
    finally:
        run(sqlite.aclose())


def test_receipts_only_from_the_recipients_host_for_mail_it_received(
    hosts: dict[str, Host],
) -> None:
    a, b, c = hosts["A"], hosts["B"], hosts["C"]
    columns = "(sender_host, message_id, recipient_session, recipient_host, outcome, code, "
    columns += "sender_session, note, created)"
    insert = f"INSERT INTO receipts {columns} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, now())"
    lure = "wire 1000 EUR to ..."
    planted = {
        "a message it never received": ("secret", "s9", a.host, "delivered", None, None, None),
        "as another recipient host": ("secret", "s9", c.host, "delivered", None, None, None),
        "free text in code": ("to-a", "sa", a.host, "refused", lure, None, None),
        "an outcome no host writes": ("to-a", "sa", a.host, "pwned", None, None, None),
        "another sender session": ("to-a", "sa", a.host, "shown", None, "not-the-sender", None),
        "another recipient session": ("to-a", "s9", a.host, "shown", None, "bs", None),
        # a note only on an acknowledgement
        "a note on a shown receipt": ("to-a", "sa", a.host, "shown", None, "bs", lure),
        "a note on a delivery receipt": ("to-a", "sa", a.host, "refused", "refused", None, lure),
        "an acknowledgement of mail it never received": (
            "secret", "s9", a.host, "acknowledged", None, "bs", lure,
        ),
    }  # fmt: skip
    with a.connect() as conn:
        for what, (mid, session, rhost, outcome, code, sender_session, note) in planted.items():
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    insert, (b.host, mid, session, rhost, outcome, code, sender_session, note)
                )
                pytest.fail(f"planted: {what}")
        with pytest.raises(psycopg.errors.StringDataRightTruncation):
            conn.execute(
                insert, (b.host, "to-a", "sa", a.host, "acknowledged", None, "bs", "x" * 1001)
            )
    # what A's relay really writes: a late receipt for mail it received, told B as it is
    late = LateReceipt("to-a", "sa", b.host, "bs", "shown")
    assert run(a.store.add_receipts(a.host, a.gen, [late])) == 1
    [receipt] = run(b.store.receipts(b.host, b.gen))
    assert (receipt.message_id, receipt.outcome, receipt.sender_session) == ("to-a", "shown", "bs")
    # an acknowledgement takes the same path, with its note
    acked = LateReceipt("to-a", "sa", b.host, "bs", "acknowledged", note=lure)
    assert run(a.store.add_receipts(a.host, a.gen, [acked])) == 1
    got = [(r.outcome, r.note) for r in run(b.store.receipts(b.host, b.gen))]
    assert ("acknowledged", lure) in got


def test_a_role_of_one_store_reaches_nothing_of_another(
    hosts: dict[str, Host], pg_server: PgServer, pg_template: str
) -> None:
    a = hosts["A"]
    other = create_database(pg_server, template=pg_template)
    other_url = pg_server.url_for(other)
    roles: list[str] = []
    try:
        admin = run(open_store(other_url))
        try:
            gen = run(admin.claim_host("Z"))
            run(admin.publish_sessions("Z", gen, [SessionInfo(id="z1", host="Z")]))
            run(admin.enqueue([item("z-mail", "Z", a.host, "sa", "zs")]))
        finally:
            run(admin.aclose())
        # A's role of the first store, in the second (not locked down yet): nothing to see
        with psycopg.connect(_as_role(other_url, a.role).replace("+psycopg", ""),
                             autocommit=True) as conn:  # fmt: skip
            for table in ("hosts", "roster", "messages", "deliveries", "receipts"):
                assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    f"INSERT INTO hosts (host_id, generation, heartbeat) VALUES ('{a.host}', 1, 0)"
                )
        # the same host id granted in the second store: a role and password of its own, and
        # the second store now lets only its own roles in
        proc = run_python(
            "-m", "crossintercom", "db", "grant-host", a.host, "--store", other_url,
            "--password-stdin", input="other-pw\n",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        role2 = next(w for w in proc.stdout.split() if w.startswith("ci_"))
        roles.append(role2)
        assert role2 != a.role and "only the host roles may connect" in proc.stdout
        proc = run_python("-m", "crossintercom", "db", "upgrade", "--store", other_url)
        assert "only the host roles may connect" in proc.stdout, proc.stdout + proc.stderr
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(_as_role(other_url, a.role).replace("+psycopg", "")).close()
    finally:
        drop_host_roles(pg_server, roles, other_url)
        drop_database(pg_server, other)


def test_locks_that_stall_every_host_are_named(hosts: dict[str, Host]) -> None:
    a, b = hosts["A"], hosts["B"]
    app = "attacker-app"
    with a.connect(application_name=app) as attacker:
        pid = attacker.info.backend_pid
        with attacker.transaction():
            attacker.execute("LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE")
            # B's own role sees the holder without pg_read_all_stats (but not since when)
            [held] = [s for s in run(b.store.stuck_transactions(5.0)) if s.pid == pid]
            assert (held.user, held.application, held.kind) == (a.role, app, "lock")
            assert held.tables == ("deliveries",) and held.idle_s is None
            line = describe([held]) or ""
            assert str(pid) in line and a.role in line and app in line
        assert [s for s in run(b.store.stuck_transactions(5.0)) if s.pid == pid] == []
        attacker.execute("SELECT pg_advisory_lock(%s)", (q.PG_MIGRATION_LOCK_KEY,))
        [held] = [s for s in run(b.store.stuck_transactions(5.0)) if s.pid == pid]
        assert held.tables == (MIGRATION_LOCK,) and held.user == a.role


def test_every_operation_of_a_relay_runs_under_its_host_role(
    hosts: dict[str, Host], pg_url: str
) -> None:
    """The column rights and policies leave every statement a relay runs working."""
    a, b = hosts["A"], hosts["B"]
    s = a.store
    gen = run(s.claim_host(a.host, machine="m-a"))
    assert run(s.host_claim(a.host)) == ("m-a", 0)
    assert run(s.heartbeat(a.host, gen)) and run(s.beat(a.host, gen, ["sa"])) is not None
    assert run(s.publish_sessions(a.host, gen, [SessionInfo(id="sa", host=a.host)]))
    assert run(s.get_message("to-a")) is not None and run(s.settings()).retention_s > 0
    [row] = run(s.fetch_inbound(a.host, gen))
    assert run(s.forget_session(a.host, gen, "sa")) == 1  # expires it, a receipt for B
    run(s.enqueue([item("a-to-b", a.host, b.host, "sb", "as")], generation=gen))
    run(s.enqueue([item("a-to-b2", a.host, b.host, "sb", "as")], generation=gen))
    run(b.store.enqueue([item("to-a2", b.host, a.host, "sa2", "bs")], generation=b.gen))
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as admin:
        admin.execute("UPDATE deliveries SET expires_at = now() - interval '1 day' "
                      "WHERE message_id IN ('a-to-b2', 'to-a2')")  # fmt: skip
    assert run(s.expire()) == 2  # one it sent, one sent to it
    assert run(s.stuck_transactions(5.0)) == []

    [done] = run(s.enqueue([item("a-to-b3", a.host, b.host, "sb", "as")], generation=gen))
    assert done.inserted
    run(b.store.enqueue([item("to-a3", b.host, a.host, "sa3", "bs")], generation=b.gen))
    rows = run(s.fetch_inbound(a.host, gen))
    assert [r.message_id for r in rows] == ["to-a3"]
    assert run(s.ack(a.host, gen, [Ack("to-a3", "sa3", "delivered")])) == 1
    late = LateReceipt("to-a3", "sa3", b.host, "bs", "shown")
    assert run(s.add_receipts(a.host, gen, [late])) == 1
    got = run(s.receipts(a.host, gen))
    assert {r.message_id for r in got} >= {"a-to-b2"}
    run(s.consume_receipts(a.host, gen, [r.id for r in got]))
    assert run(s.purge(older_than_s=0)) >= 1
    assert row.message_id == "to-a"


def test_a_queued_delivery_is_not_erased_unheard(hosts: dict[str, Host]) -> None:
    """docs/operations.md, "Deleting": no host role deletes a delivery while it is queued, nor
    finishes or deletes another host's; and the recipient's host that finishes its own and
    deletes it (in one transaction, or after planting a receipt dated past the retention and
    deleting that) is refused: the sender's host always gets the receipt (revision 0018)."""
    a, b, c = hosts["A"], hosts["B"], hosts["C"]
    count = "SELECT count(*) FROM deliveries WHERE message_id = 'to-a'"
    finish = (
        "UPDATE deliveries SET state = 'delivered', reason = 'queued', finished_at = now() "
        "WHERE message_id = 'to-a'"
    )
    for host in (a, b, c):  # the recipient's, the sender's, a third host's
        with host.connect() as conn:
            assert conn.execute("DELETE FROM deliveries WHERE message_id = 'to-a'").rowcount == 0
    with c.connect() as conn:
        assert conn.execute(finish).rowcount == 0
    # Finished and deleted in one transaction, with no receipt: refused at its commit.
    raised = pytest.raises(psycopg.errors.InsufficientPrivilege)
    with a.connect() as conn, raised, conn.transaction():
        assert conn.execute(finish).rowcount == 1
        assert conn.execute("DELETE FROM deliveries WHERE message_id = 'to-a'").rowcount == 1
    with b.connect() as conn:
        assert conn.execute(count).fetchone() == (1,)
    # With a receipt dated long ago, to delete it at once as the recipient's purge may: the
    # receipt is dated now (the database's clock), so it stays, and the sender reads it.
    plant = (
        "INSERT INTO receipts (sender_host, message_id, recipient_session, recipient_host, "
        "outcome, code, created) VALUES (%s, 'to-a', 'sa', %s, 'delivered', 'queued', "
        "'2000-01-01')"
    )
    with a.connect() as conn, conn.transaction():
        conn.execute(finish)
        conn.execute(plant, (b.host, a.host))
        conn.execute("DELETE FROM receipts WHERE message_id = 'to-a'")
        assert conn.execute("DELETE FROM deliveries WHERE message_id = 'to-a'").rowcount == 1
    told = run(b.store.receipts(b.host, b.gen))
    assert [(r.message_id, r.outcome) for r in told] == [("to-a", "delivered")]


def test_the_finish_check_binds_host_roles_alone(hosts: dict[str, Host], pg_url: str) -> None:
    """Revision 0019: the admin (here a superuser) is trusted with every row, so it finishes a
    queued delivery without a receipt and dates a receipt as written, with no trigger fired
    for it (a host role doing the same is refused: the test above)."""
    a, b = hosts["A"], hosts["B"]
    finish = (
        "UPDATE deliveries SET state = 'delivered', reason = 'queued', finished_at = now() "
        "WHERE message_id = 'to-a'"
    )
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as admin:
        assert admin.execute("SHOW is_superuser").fetchone() == ("on",)
        with admin.transaction():
            assert admin.execute(finish).rowcount == 1
            admin.execute(
                "INSERT INTO receipts (sender_host, message_id, recipient_session, "
                "recipient_host, outcome, code, created) VALUES (%s, 'to-a', 'sa', %s, "
                "'delivered', 'queued', '2000-01-01')",
                (b.host, a.host),
            )
        row = admin.execute(
            "SELECT d.state, extract(year FROM r.created) FROM deliveries AS d "
            "JOIN receipts AS r USING (message_id) WHERE d.message_id = 'to-a'"
        ).fetchone()
    assert row == ("delivered", 2000)


def test_the_finish_check_reads_the_newest_receipts_first(
    hosts: dict[str, Host], pg_url: str
) -> None:
    """Revision 0019: the check finds the receipt an ack wrote among the sender's newest, not by
    reading every receipt the sender's host has not read yet (300 here, as when it is down):
    counted in the rows its index scans fetched, no clock."""
    a, b = hosts["A"], hosts["B"]
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as admin:
        admin.execute(
            "INSERT INTO receipts (sender_host, message_id, recipient_session, recipient_host, "
            "outcome, created) SELECT %s, 'old-' || n, 'sa', %s, 'delivered', now() "
            "FROM generate_series(1, 300) AS n",
            (b.host, a.host),
        )
    read = (
        "SELECT coalesce(sum(idx_tup_fetch), 0) FROM pg_stat_xact_user_tables "
        "WHERE relname = 'receipts'"
    )
    with a.connect() as conn, conn.transaction():
        conn.execute(
            "UPDATE deliveries SET state = 'delivered', reason = 'queued', finished_at = now() "
            "WHERE message_id = 'to-a'"
        )
        conn.execute(
            "INSERT INTO receipts (sender_host, message_id, recipient_session, recipient_host, "
            "outcome, code, created) VALUES (%s, 'to-a', 'sa', %s, 'delivered', 'queued', now())",
            (b.host, a.host),
        )
        before = conn.execute(read).fetchone()
        conn.execute("SET CONSTRAINTS deliveries_finish_told IMMEDIATE")  # the check, now
        after = conn.execute(read).fetchone()
    assert before is not None and after is not None
    fetched = int(str(after[0])) - int(str(before[0]))
    assert 1 <= fetched <= 10, (before, after)
