"""A member of a group runtime dir races the other members' processes: it swaps a file it may
replace (its own) for a symlink between another process's check of that file and its open, or
plants a link where a file is about to be created. No process opens another file through it
(docs/operations.md, "Files in the runtime dir")."""

from __future__ import annotations

import grp
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossintercom.errors import RuntimeDirError
from crossintercom.inbox import Inbox
from crossintercom.local_broker.authority.dedup import DedupAuthority
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import Message, Peer
from crossintercom.runtime import ensure_runtime_dir
from crossintercom.testhooks import FAULTS_ENV
from tests.conftest import make_env, settings_for
from tests.procs import wait_for
from tests.unixuser import SHARED_GROUP, as_nobody, need_root, python_for, spawn_as_user

SECRET = "root-only secret 0123456789"
MEMBER = "nobody"
# The attacker's loop: its inbox aside, a link to the secret inbox in its place, its inbox
# back over the link, until the reader is done (the stop file) or the deadline.
SWAPPER = """
import os, sys, time
inbox, aside, target, stop = sys.argv[1:5]
end = time.monotonic() + float(sys.argv[5])
swaps = 0
while time.monotonic() < end and not os.path.exists(stop):
    os.rename(inbox, aside)
    os.symlink(target, inbox)
    os.rename(aside, inbox)
    swaps += 1
print(swaps)
"""


def _inbox_holding(directory: Path, name: str, text: str) -> Path:
    with Inbox(directory, name) as box:
        box.save(
            Message(id=f"m-{name}", sender=Peer(id="s", name="a", host="h"), to=name, text=text)
        )
    return directory / f"{name}.sqlite"


@pytest.fixture
def group_inbox_dir(runtime_home: Path) -> Iterator[tuple[Path, Path, int]]:
    """(the group runtime dir's inbox dir, a root-only dir outside it, the group's gid)."""
    need_root()
    runtime_home.chmod(0o755)
    vault = runtime_home / "vault"
    vault.mkdir(mode=0o700)
    settings = settings_for(make_env(runtime_home / "shared", CROSSINTERCOM_GROUP=SHARED_GROUP))
    ensure_runtime_dir(settings)
    yield settings.inbox_dir, vault, grp.getgrnam(SHARED_GROUP).gr_gid


def test_inbox_swapped_for_a_link_while_viewed_never_shows_the_link(
    group_inbox_dir: tuple[Path, Path, int],
) -> None:
    """The overseer page and inbox search read each member's inbox: a member who keeps
    swapping its own inbox for a link to another inbox (which the reader may read, the member
    not) never has the reader show it, however the swaps fall between check and open."""
    inbox_dir, vault, gid = group_inbox_dir
    secret = _inbox_holding(vault, "victim", SECRET)
    own = _inbox_holding(vault, "own", "the member's own mail")
    mine = inbox_dir / "x.sqlite"
    shutil.copyfile(own, mine)
    shutil.chown(mine, MEMBER, SHARED_GROUP)
    mine.chmod(0o660)
    stop = vault.parent / "stop"
    interpreter, env = python_for(MEMBER, {"PATH": "/usr/bin:/bin"})
    argv = (str(mine), str(inbox_dir / ".x.aside"), str(secret), str(stop), "60")
    attacker = spawn_as_user(MEMBER, *interpreter, "-c", SWAPPER, *argv, groups=(gid,), env=env)
    shown: list[str] = []
    try:
        deadline = time.monotonic() + 20
        reads = 0
        while reads < 3000 and time.monotonic() < deadline and attacker.poll() is None:
            reads += 1
            try:
                with Inbox.view(inbox_dir, "x") as seen:
                    shown += [str(e.body) for e in seen.messages()]
            except sqlite3.Error:
                continue  # caught between two names: an error, not another file
            if any(SECRET in s for s in shown):
                break
    finally:
        stop.touch()
        out, err = attacker.communicate(timeout=30)
    assert attacker.returncode == 0, err
    assert int(out) > 100, "the member's swaps must really have run alongside the reads"
    assert not any(SECRET in s for s in shown)
    assert any("the member's own mail" in s for s in shown)


WRITER = """
import sys
from pathlib import Path
from crossintercom.errors import RuntimeDirError
from crossintercom.inbox import Inbox
from crossintercom.local_broker.authority.dedup import DedupAuthority
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import Message, Peer
import time
n, go = int(sys.argv[2]), Path(sys.argv[3])
with Inbox(Path(sys.argv[1]), "w", 0o660) as box:
    for i in range(n):
        if i == n // 2:  # halfway, until the reader has seen a part (however busy the machine)
            deadline = time.monotonic() + 60
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        peer = Peer(id="s", name="a", host="h")
        box.save(Message(id=f"m-{i}", sender=peer, to="w", text="x" * i))
"""


def test_a_members_inbox_read_while_it_writes_reads_whole_commits(
    group_inbox_dir: tuple[Path, Path, int],
) -> None:
    """Another member's inbox is read through a private copy taken under SQLite's shared lock:
    read while its owner keeps saving, every read succeeds and shows whole commits, in order."""
    inbox_dir, _, gid = group_inbox_dir
    interpreter, env = python_for(MEMBER, {"PATH": "/usr/bin:/bin"})
    go = inbox_dir.parent / "go"
    writer = spawn_as_user(
        MEMBER,
        *interpreter,
        *("-c", WRITER, str(inbox_dir), "400", str(go)),
        groups=(gid,),
        env=env,
    )
    counts: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (writer.poll() is None or not counts):
            with Inbox.view(inbox_dir, "w") as seen:
                entries = seen.messages()
            assert [e.body["id"] for e in entries] == [f"m-{i}" for i in range(len(entries))]
            counts.append(len(entries))
            if 0 < len(entries) < 400:
                go.touch()  # seen while the writer was under way: it may finish
    finally:
        _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert counts == sorted(counts)
    assert any(0 < c < 400 for c in counts), "the reads must have overlapped the writes"
    with Inbox.view(inbox_dir, "w") as seen:
        assert len(seen.messages()) == 400
    # Created by a member whose own group is another, in the runtime group all the same.
    assert (inbox_dir / "w.sqlite").stat().st_gid == gid


OPEN_AUTHORITY = """
import sys
from pathlib import Path
from crossintercom.local_broker.authority.dedup import DedupAuthority
from crossintercom.local_broker.state.store import BrokerState
with DedupAuthority(Path(sys.argv[1])) as auth:
    auth.lodge("m-1", b"payload")
"""


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"


@pytest.mark.parametrize("side", ["-wal", "-journal"])
def test_link_planted_as_an_authority_journal_while_it_opens_is_never_written(
    group_inbox_dir: tuple[Path, Path, int], side: str
) -> None:
    """The dedup authority's WAL does not exist between broker runs, nor before its first open
    the journal of its switch to WAL, and SQLite creates them on open: a member who links a
    file of its own there once the broker has checked the dir would have the broker write its
    dedup records into that file (and, after a crash, roll the member's back into the
    database). The broker makes them its own before the check, so the link cannot be made."""
    inbox_dir, _, gid = group_inbox_dir
    home = inbox_dir.parent
    if side == "-wal":
        DedupAuthority(home).close()  # in WAL mode from now on
    wal = home / (DedupAuthority.FILE + side)
    assert not os.path.lexists(wal)
    bait = home / "bait"
    as_nobody("sh", "-c", f"echo bait > {bait}", groups=(gid,))
    opener = subprocess.Popen(
        [sys.executable, "-c", OPEN_AUTHORITY, str(home)],
        env={**os.environ, FAULTS_ENV: "stop:authority.claimed"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _stopped(opener.pid), 30, "the broker stopped between check and open")
        as_nobody("ln", str(bait), str(wal), groups=(gid,))
    finally:
        opener.send_signal(signal.SIGCONT)
        _, err = opener.communicate(timeout=60)
    assert bait.read_bytes() == b"bait\n"
    assert opener.returncode == 0, err
    assert not os.path.lexists(wal) or os.lstat(wal).st_ino != bait.stat().st_ino


@pytest.mark.parametrize("name", ["broker.sqlite", "inbox/x.sqlite"])
def test_members_sqlite_file_swapped_for_a_link_as_it_is_opened_is_not_followed(
    group_inbox_dir: tuple[Path, Path, int], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """broker.sqlite (whichever member ran the broker last) and an inbox may be another
    member's file, which it may replace in the sticky dir: swapped for a link right after the
    checks, just as SQLite opens it by name, the link is never written through."""
    inbox_dir, vault, gid = group_inbox_dir
    home = inbox_dir.parent
    victim = vault / "victim"
    victim.touch(mode=0o600)
    target = home / name
    for side in ("", "-wal", "-shm", "-journal"):
        (path := Path(f"{target}{side}")).touch(mode=0o660)
        shutil.chown(path, MEMBER, SHARED_GROUP)
    real = sqlite3.connect
    swaps: list[str] = []

    def swap_then_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        if not swaps:  # the member's move, once the checks are done
            swaps.append(name)
            aside = f"{target}.aside"
            as_nobody("sh", "-c", f"mv {target} {aside} && ln -s {victim} {target}", groups=(gid,))
        connection: sqlite3.Connection = real(*args, **kwargs)
        return connection

    monkeypatch.setattr(sqlite3, "connect", swap_then_connect)
    with pytest.raises(RuntimeDirError, match="replaced while being opened"):
        if name == "broker.sqlite":
            BrokerState(home, 0o660)
        else:
            Inbox(inbox_dir, "x", 0o660)
    assert swaps
    assert victim.read_bytes() == b""
    assert sorted(p.name for p in vault.iterdir()) == ["victim"]
