"""The SQLite store on real shared filesystems: FUSE mounts of one directory (tests/fusemounts.py).

Two hosts on two bindfs mounts of one directory, whose fcntl locks do not exclude each other:
the lock beacon (storage/lockcheck.py) refuses before the second relay writes anything, the
first stops within seconds, sends answer ``not_sent`` (``store_locks_unsafe``), `status` says
why, the store stays intact and nothing acknowledged is lost. On one mount, where locks exclude
but the filesystem is FUSE, the relays poll their doorbells without being told to.
"""

from __future__ import annotations

import functools
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossintercom.config import ENV_STORE
from crossintercom.relay.run import ENV_POLLING_OBSERVER
from crossintercom.storage import migrate
from crossintercom.storage.lockcheck import beacon_dir
from crossintercom.storage.wakeup import filesystem_type
from crossintercom.tools import harness
from tests.fusemounts import SharedDir, lock_seen, shared_dir
from tests.procs import clean_env
from tests.relay.conftest import Cluster, Host, wait_for
from tests.relay.test_systemd_notify import NotifySocket
from tests.web.conftest import start_web
from tests.web.test_overseer import request

ACKNOWLEDGED = ("queued", "delivered")


@pytest.fixture
def two_mounts() -> Iterator[SharedDir]:
    with shared_dir(2) as shared:
        yield shared


def url_through(mount: Path) -> str:
    return f"sqlite:///{mount / 'mailbox.sqlite'}"


def refused(host: Host) -> bool:
    store = host.cli_json("status")["relay"].get("store") or ""
    return "REFUSED" in store and "do not exclude" in store and "PostgreSQL" in store


class Senders:
    """One thread per host sending to the sink on the other host until stopped; every
    outcome kept by message id."""

    def __init__(self, pairs: list[tuple[Host, str]]) -> None:
        self.outcomes: dict[str, tuple[str, str | None, str]] = {}  # id -> outcome, code, to
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._send, args=(host, to, i), daemon=True)
            for i, (host, to) in enumerate(pairs)
        ]
        for t in self.threads:
            t.start()

    def _send(self, host: Host, to: str, k: int) -> None:
        try:
            client = host.client(f"sender{k}")
            n = 0
            while not self.stop.is_set():
                n += 1
                r = client.send(to, f"load {k} {n}")
                with self._lock:
                    self.outcomes[r.id] = (r.outcome.value, r.code, to)
        except BaseException as exc:  # the test reads it
            self.errors.append(exc)

    def codes(self, to: str) -> list[str | None]:
        with self._lock:
            return [code for _, code, t in self.outcomes.values() if t == to]

    def tail(self) -> str:
        with self._lock:
            return f"{list(self.outcomes.values())[-6:]} {self.errors}"

    def finish(self) -> dict[str, tuple[str, str | None, str]]:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not self.errors, self.errors
        return dict(self.outcomes)


def stop_all(hosts: list[Host]) -> None:
    """Every host's processes, stopped in parallel."""
    for h in hosts:
        h.begin_stop()
    for h in hosts:
        h.stop()


def intact(conn: sqlite3.Connection) -> bool:
    return bool(conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)])


def generation(db: Path, host_id: str) -> int:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT generation FROM hosts WHERE host_id = ?", (host_id,)).fetchone()
    return int(row[0])


def test_locks_that_do_not_exclude_are_refused_before_the_store_is_damaged(
    two_mounts: SharedDir,
) -> None:
    m0, m1 = two_mounts.mounts
    assert lock_seen(m0 / "probe", m0 / "probe"), "locks within one mount must exclude"
    assert not lock_seen(m0 / "probe", m1 / "probe"), "the two mounts' locks must not exclude"
    db = two_mounts.backing / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    root = two_mounts.root / "hosts"
    root.mkdir()
    a = Host(root, "A", url_through(m0), base_env=clean_env())
    b = Host(root, "B", url_through(m0), base_env=clean_env())
    hosts = [a, b]
    try:
        # One mount first: its locks exclude, so both relays run and mail flows.
        for h in hosts:
            h.configure(**harness.BULK_SENDER, remote_ack_wait_s=1)
            h.start_relay()
        a.listen("sink")
        b.listen("sink")
        a.wait_sees("sink", "B")
        b.wait_sees("sink", "A")
        assert a.client("hello").send("sink@B", "before").outcome.value == "delivered"
        b_generation = generation(db, "B")

        # B moves to the other mount while both hosts send: its relay must find that the
        # locks do not exclude before it writes anything, and A's must stop writing too.
        b.stop_relay()
        b.env[ENV_STORE] = url_through(m1)
        senders = Senders([(a, "sink@B"), (b, "sink@A"), (a, "sink@B"), (b, "sink@A")])
        b.start_relay()
        wait_for(lambda: refused(b), 30, "B's status to say its store's locks do not exclude")
        wait_for(lambda: refused(a), 30, "A's status to say its store's locks do not exclude")
        # Sends both ways are now refused, with the code of their own.
        seen_a = len(senders.codes("sink@B"))
        seen_b = len(senders.codes("sink@A"))

        def refused_both_ways() -> bool:
            later_a = senders.codes("sink@B")[seen_a:]
            later_b = senders.codes("sink@A")[seen_b:]
            return bool(later_a and later_b) and all(
                c == "store_locks_unsafe" for c in later_a + later_b
            )

        wait_for(
            refused_both_ways,
            30,
            lambda: f"sends both ways to answer not_sent store_locks_unsafe: {senders.tail()}",
        )
        outcomes = senders.finish()
        # The overseer page says it too.
        web = start_web(b)
        try:
            auth = {"Authorization": f"Bearer {web.token}"}

            def page_warns() -> bool:
                warnings = request(web.base + "/api/roster", headers=auth)[1]["warnings"]
                return any("do not exclude" in w for w in warnings)

            wait_for(page_warns, 30, "the overseer page to show the refusal")
        finally:
            web.stop()
        assert "do not exclude" in b.relay_log() and "do not exclude" in a.relay_log()
        # B never wrote: no claim of its host id (a relay's first write) through the other mount.
        assert generation(db, "B") == b_generation
    finally:
        stop_all(hosts)

    with sqlite3.connect(db) as conn:
        assert intact(conn)
        stored = {r[0] for r in conn.execute("SELECT message_id FROM messages")}
    inboxes = {"sink@A": set(a.inbox("sink")), "sink@B": set(b.inbox("sink"))}
    acknowledged = {i: to for i, (out, _, to) in outcomes.items() if out in ACKNOWLEDGED}
    lost = [i for i, to in acknowledged.items() if i not in stored and i not in inboxes[to]]
    assert lost == [], f"{len(lost)} acknowledged messages are nowhere"
    refusals = [o for o in outcomes.values() if o[0] == "not_sent"]
    assert refusals and {code for _, code, _ in refusals} <= {"store_locks_unsafe", "no_relay"}
    # The beacon's records are gone with the relays that wrote them.
    assert [p.name for p in beacon_dir(db).iterdir() if p.name != "beacon"] == []


def test_a_fuse_mount_is_told_apart(two_mounts: SharedDir) -> None:
    assert filesystem_type(two_mounts.mounts[0] / "mailbox.sqlite") == "fuse"
    assert filesystem_type(two_mounts.backing / "mailbox.sqlite") != "fuse"


@pytest.fixture
def one_mount() -> Iterator[SharedDir]:
    with shared_dir(1) as shared:
        yield shared


def says(host: Host, text: str) -> None:
    """Until the host's relay's `status` line holds ``text`` (it is set once the relay runs)."""

    def store() -> str:
        return str(host.cli_json("status")["relay"].get("store") or "")

    wait_for(lambda: text in store(), 30, lambda: f"{text!r} in the status line {store()!r}")


def test_relays_on_fuse_poll_their_doorbells_by_themselves(one_mount: SharedDir) -> None:
    url = url_through(one_mount.mounts[0])
    migrate.upgrade(url)
    with Cluster(url) as cluster:
        a, b = cluster.up("A", "B")
        for h in (a, b):
            says(h, "doorbells polled every 0.5 s: the store is on fuse")
        b.listen("worker")
        a.wait_sees("worker", "B")
        assert a.client("planner").send("worker@B", "through polling").outcome.value == "delivered"
        # The override, the other way: inotify on FUSE, said with a warning.
        b.stop_relay()
        b.env[ENV_POLLING_OBSERVER] = "0"
        b.start_relay()
        says(b, "WARNING doorbells watched with inotify on fuse")


def test_relays_started_together_on_two_mounts_never_both_write(two_mounts: SharedDir) -> None:
    """Each relay writes its record before it probes, so of two starting at once at least one
    sees the other and refuses before it writes; the other finds it on its next beats."""
    m0, m1 = two_mounts.mounts
    db = two_mounts.backing / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    root = two_mounts.root / "hosts"
    root.mkdir()
    hosts = [
        Host(root, "A", url_through(m0), base_env=clean_env()),
        Host(root, "B", url_through(m1), base_env=clean_env()),
    ]
    notify = NotifySocket()  # systemd's, for B: ready, with the refusal as its status
    hosts[1].env["NOTIFY_SOCKET"] = notify.name
    try:
        for h in hosts:
            h.start_relay(wait=False)
        for h in hosts:
            h.wait_relay()
        for h in hosts:
            wait_for(functools.partial(refused, h), 30, f"{h.host_id}'s status: the refusal")
        notify.wait_field("READY=1")
        wait_for(
            lambda: any(f.startswith("STATUS=REFUSED") for f in notify.got + notify.drain(0.1)),
            30,
            lambda: f"systemd's status to be the refusal: {notify.got[-10:]}",
        )
    finally:
        stop_all(hosts)
        notify.close()
    with sqlite3.connect(db) as conn:
        assert intact(conn)
        claimed = [r[0] for r in conn.execute("SELECT host_id FROM hosts")]
    assert len(claimed) <= 1, claimed  # a relay's first write is its host's claim


def test_a_beacon_that_cannot_be_made_stops_the_relay_with_its_reason(tmp_path: Path) -> None:
    db = tmp_path / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    beacon_dir(db).write_text("not a directory")
    root = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))
    host = Host(root, "A", f"sqlite:///{db}", base_env=clean_env())
    try:
        relay = host.spawn_relay()
        assert relay.wait(60) != 0
        log = host.relay_log(relay)
        assert "the lock beacon" in log and "cannot be made or locked" in log, log
    finally:
        host.stop()
        shutil.rmtree(root, ignore_errors=True)
