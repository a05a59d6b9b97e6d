"""The lock beacon (storage/lockcheck.py): relays that see each other's locks pass at once, a dead
relay's record is cleared, relays on two FUSE mounts whose locks do not exclude are refused (both
of them), and a refused process runs no transaction on the store. Each relay is its own process:
fcntl locks belong to processes."""

from __future__ import annotations

import errno
import fcntl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossintercom.errors import StoreLocksUnsafe
from crossintercom.storage import lockcheck, migrate
from crossintercom.storage.blocking import BlockingStore, open_blocking_store
from crossintercom.storage.lockcheck import LockBeacon, beacon_dir
from crossintercom.storage.wakeup import filesystem_type, polling_needed
from tests.fusemounts import SharedDir, shared_dir

# A relay's part in the check, alone in a process: starts, says what it found, then beats until
# its stdin closes, saying so again whenever the verdict changes.
PEER = """
import select, sys, time
from pathlib import Path
from crossintercom.storage.lockcheck import BEAT_S, LockBeacon
beacon = LockBeacon(Path(sys.argv[1]), sys.argv[2])
said = beacon.start()
print("refused" if said else "ok", flush=True)
while not select.select([sys.stdin], [], [], BEAT_S)[0]:
    now = beacon.tick()
    if now != said:
        said = now
        print("refused" if said else "ok", flush=True)
beacon.close()
"""


class Peer:
    def __init__(self, db: Path, host: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PEER, str(db), host],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def said(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def two_mounts() -> Iterator[SharedDir]:
    with shared_dir(2) as shared:
        yield shared


def records(db: Path) -> list[str]:
    return sorted(p.name for p in beacon_dir(db).iterdir() if p.name != "beacon")


def test_relays_whose_locks_exclude_pass_without_waiting(tmp_path: Path) -> None:
    db = tmp_path / "mailbox.sqlite"
    peer = Peer(db, "A")
    try:
        assert peer.said() == "ok"
        beacon = LockBeacon(db, "B")
        try:
            assert beacon.start() is None
            # The peer's byte was held: nothing to watch, so start did not wait on it.
            assert beacon._suspects == {}
            assert beacon.tick() is None and beacon._suspects == {}
        finally:
            beacon.close()
    finally:
        peer.stop()
    assert records(db) == []


def test_a_dead_relays_record_is_cleared(tmp_path: Path) -> None:
    db = tmp_path / "mailbox.sqlite"
    beacon_dir(db).mkdir()
    dead = beacon_dir(db) / "0123456789abcdef-77"
    dead.write_bytes(b"5\nA\n")  # its byte is free: the relay that held it is gone
    beacon = LockBeacon(db, "B")
    try:
        assert beacon.start() is None
        assert records(db) == [beacon.name]
    finally:
        beacon.close()


def test_locks_that_do_not_exclude_are_found_from_both_sides(two_mounts: SharedDir) -> None:
    m0, m1 = two_mounts.mounts
    first = Peer(m0 / "mailbox.sqlite", "A")
    try:
        assert first.said() == "ok"  # alone: nothing to compare with yet
        second = Peer(m1 / "mailbox.sqlite", "B")
        try:
            assert second.said() == "refused"  # before it would open the store
            assert first.said() == "refused"  # on a later beat
        finally:
            second.stop()
    finally:
        first.stop()


def new_store(tmp_path: Path) -> tuple[Path, BlockingStore]:
    """A new SQLite store, opened for blocking callers."""
    db = tmp_path / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    return db, open_blocking_store(f"sqlite:///{db}")


def test_a_refused_process_runs_no_transaction(tmp_path: Path) -> None:
    db, blocking = new_store(tmp_path)
    try:
        assert blocking.run(blocking.store.hosts()) == []
        lockcheck.refuse(db, "REFUSED: for the test")
        with pytest.raises(StoreLocksUnsafe, match="for the test") as err:
            blocking.run(blocking.store.claim_host("A", "m"))
        assert err.value.code == "store_locks_unsafe"
    finally:
        lockcheck._refused.clear()
        blocking.close()


def test_the_filesystem_type_comes_from_mountinfo(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "45 22 0:40 / /mnt/a\\040share rw - fuse.sshfs host:/x rw\n"
        "46 22 0:41 / /mnt/nfs rw - nfs4 srv:/e rw\n"
    )
    assert filesystem_type(Path("/mnt/a share/db.sqlite"), info) == "fuse.sshfs"
    assert filesystem_type(Path("/mnt/nfs/x/db.sqlite"), info) == "nfs4"
    assert filesystem_type(Path("/mnt/nfsx/db.sqlite"), info) == "ext4"
    assert polling_needed(tmp_path / "db.sqlite") is None or "fuse" not in str(tmp_path)


def test_a_fuse_mount_needs_polling(two_mounts: SharedDir) -> None:
    assert polling_needed(two_mounts.mounts[0] / "mailbox.sqlite") == "fuse"
    assert polling_needed(two_mounts.backing / "mailbox.sqlite") is None


def test_the_store_polls_by_itself_on_fuse(two_mounts: SharedDir) -> None:
    from crossintercom.storage.sqlite import Sqlite
    from crossintercom.storage.urls import parse_store_url

    for mount, asked, polls in [(0, None, True), (0, False, False), (1, True, True)]:
        url = f"sqlite:///{two_mounts.mounts[mount] / 'mailbox.sqlite'}"
        migrate.upgrade(url)
        # The store's SQLite dialect decides how its waiters watch the doorbells.
        dialect = Sqlite(parse_store_url(url), asked)
        assert dialect.polling_observer is polls
        assert (dialect.wakeup_note or "").startswith(
            "WARNING" if not polls else "doorbells polled"
        )


def test_a_filesystem_without_locks_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS without its lock manager answers ENOLCK: no check is possible, and SQLite could not
    keep writers apart either."""
    db = tmp_path / "mailbox.sqlite"

    def no_locks(*_args: object) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    beacon = LockBeacon(db, "A")
    try:
        why = beacon.start()
        assert why is not None and "grants no byte-range locks" in why
        assert lockcheck.refusal(db) == why
    finally:
        beacon.close()
        lockcheck._refused.clear()


def test_the_roster_is_read_without_locks(tmp_path: Path) -> None:
    """What a refusing relay shows of the other hosts (sqlite.roster_without_locks)."""
    from crossintercom.models import SessionInfo
    from crossintercom.storage.sqlite import roster_without_locks

    db, blocking = new_store(tmp_path)
    try:
        gen = blocking.run(blocking.store.claim_host("B", "m"))
        worker = SessionInfo(id="b-worker", name="worker", host="B", purpose="agent")
        assert blocking.run(blocking.store.publish_sessions("B", gen, [worker]))
    finally:
        blocking.close()
    assert [(s.name, s.host) for s in roster_without_locks(db)] == [("worker", "B")]
