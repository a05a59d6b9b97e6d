"""The SQLite store's files are private to their user (or the configured group) whatever the
umask: the store file, its journal and the doorbell dir. Another local user cannot open the
file; an existing store others may read is named by the store's trust check
(docs/operations.md, "Trust model")."""

from __future__ import annotations

import grp
import os
import sqlite3
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossintercom.config import ENV_GROUP
from crossintercom.storage import migrate
from crossintercom.storage.blocking import run
from crossintercom.storage.sqlite import sqlite_store
from crossintercom.storage.urls import parse_store_url
from crossintercom.storage.wakeup import doorbell_dir, doorbell_path, ring_doorbell
from tests.unixuser import SHARED_GROUP, need_root, open_dir, python_as_nobody

TRY_OPEN = "import sys; open(sys.argv[1], 'rb').read(1); print('opened')"


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A fresh directory under /tmp every user may enter."""
    d = Path(tempfile.mkdtemp(prefix="ci-perm-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        for child in sorted(d.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
        d.rmdir()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _journal_mode_during_a_write(db: Path) -> int:
    """The mode of the rollback journal SQLite makes for a write in progress."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO hosts (host_id, generation, heartbeat, roster_rev) VALUES ('x', 1, 0, 0)"
        )
        mode = _mode(Path(f"{db}-journal"))
        conn.execute("ROLLBACK")
        return mode
    finally:
        conn.close()


def test_store_files_private_under_umask_022(
    umask_022: None, public_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_GROUP, raising=False)
    db = public_dir / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    assert _mode(db) == 0o600
    assert _journal_mode_during_a_write(db) == 0o600
    ring_doorbell(db, "some-host")
    assert _mode(doorbell_dir(db)) == 0o700
    store = sqlite_store(parse_store_url(f"sqlite:///{db}"))
    try:
        assert run(store.trust_warnings()) == []
    finally:
        run(store.aclose())


def test_another_user_cannot_open_the_store(umask_022: None, public_dir: Path) -> None:
    need_root()
    db = public_dir / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    got = python_as_nobody(TRY_OPEN, str(db))
    assert got.returncode != 0 and "Permission denied" in got.stderr, got
    # nor read the doorbells (which name the hosts that get mail)
    ring_doorbell(db, "some-host")
    got = python_as_nobody("import os, sys; print(os.listdir(sys.argv[1]))", str(doorbell_dir(db)))
    assert got.returncode != 0 and "Permission denied" in got.stderr, got


def test_group_store_shared_with_the_group_only(
    umask_022: None, public_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_root()
    gid = grp.getgrnam(SHARED_GROUP).gr_gid
    monkeypatch.setenv(ENV_GROUP, SHARED_GROUP)
    db = public_dir / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    assert (_mode(db), db.stat().st_gid) == (0o660, gid)
    assert _journal_mode_during_a_write(db) == 0o660
    ring_doorbell(db, "some-host")
    bells = doorbell_dir(db)
    assert (_mode(bells), bells.stat().st_gid) == (0o2770, gid)
    assert python_as_nobody(TRY_OPEN, str(db), groups=(gid,)).stdout.strip() == "opened"
    assert python_as_nobody(TRY_OPEN, str(db)).returncode != 0


def test_existing_world_readable_store_is_named(public_dir: Path) -> None:
    db = public_dir / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    open_dir(doorbell_dir(db)).chmod(0o757)
    db.chmod(0o644)
    store = sqlite_store(parse_store_url(f"sqlite:///{db}"))
    try:
        warnings = run(store.trust_warnings())
    finally:
        run(store.aclose())
    assert len(warnings) == 2, warnings
    assert f"{db} is readable by every local user (mode 644)" in warnings[0]
    assert "doorbells is readable by every local user (mode 757)" in warnings[1]


def test_a_link_a_member_plants_in_the_doorbell_dir_is_not_written_through(
    public_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doorbell dir is the store group's to write: a member's link at the name a ring
    would write next never has the ringing process truncate the file it names."""
    need_root()
    gid = grp.getgrnam(SHARED_GROUP).gr_gid
    monkeypatch.setenv(ENV_GROUP, SHARED_GROUP)
    vault = public_dir / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "secret"
    secret.write_text("root only\n")
    db = public_dir / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    ring_doorbell(db, "some-host")
    bell = doorbell_path(db, "some-host")
    # the temporary names a ring from this process and thread used to write
    planted = bell.with_name(f"{bell.name}.{os.getpid()}.{threading.get_ident()}")
    link = "import os, sys; os.symlink(sys.argv[1], sys.argv[2])"
    made = python_as_nobody(link, str(secret), str(planted), groups=(gid,))
    assert made.returncode == 0, made
    ring_doorbell(db, "some-host")
    assert secret.read_text() == "root only\n"
    assert bell.read_text().strip().isdigit()


def test_a_store_dir_others_may_write_is_named(public_dir: Path) -> None:
    """Another user who may create files beside the store plants its journal: SQLite copies
    every page a transaction changes into it (all mail), or rolls a hot one back into the store
    (any row). The relay names such a directory at start, as it names loose files."""
    need_root()
    shared = open_dir(public_dir / "shared")
    shared.chmod(0o1777)  # sticky, like /tmp: no one replaces the store, anyone adds a name
    db = shared / "mailbox.sqlite"
    migrate.upgrade(f"sqlite:///{db}")
    planted = python_as_nobody(
        "import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o666))",
        f"{db}-journal",
    )
    assert planted.returncode == 0, planted.stderr
    os.unlink(f"{db}-journal")
    store = sqlite_store(parse_store_url(f"sqlite:///{db}"))
    try:
        warnings = run(store.trust_warnings())
    finally:
        run(store.aclose())
    assert any(f"{shared} is writable by every local user (mode 1777)" in w for w in warnings), (
        warnings
    )
