"""A member of a group runtime dir (CROSSINTERCOM_GROUP) attacks the other members' processes
through it, as a second Unix user in the group would: symlinks where the broker's files go,
a planted temporary token file, a spawn lock from the future. None of it makes a process open
another file, publish a secret or stall (docs/operations.md, "Files in the runtime dir")."""

from __future__ import annotations

import grp
import logging
import os
import pwd
import signal
import socket
import sqlite3
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crossintercom.agents.escalations.escalation import Escalation
from crossintercom.agents.escalations.supervisor import EscalationLog
from crossintercom.agents.session import agents_dir
from crossintercom.client import Client, Identity
from crossintercom.config import Settings
from crossintercom.errors import ConfigError, RuntimeDirError
from crossintercom.inbox import Inbox
from crossintercom.machine import machine_identity
from crossintercom.models import Message, Peer, durable_session_id, new_id
from crossintercom.runtime import ensure_runtime_dir, secure_tree
from crossintercom.storage import migrate
from crossintercom.tools.harness import RELAY
from crossintercom.web.auth import write_token_file
from tests.conftest import Listener, make_env, run_cli, settings_for
from tests.procs import broker_pid, pid_alive, wait_for
from tests.unixuser import (
    OTHER_USER,
    SHARED_GROUP,
    as_nobody,
    as_user,
    need_root,
    python_as_nobody,
    python_for,
)

SECRET = "root-only secret 0123456789\n"


@dataclass
class Shared:
    home: Path
    env: dict[str, str]
    settings: Settings
    gid: int
    secret: Path  # a file only root may read, outside the runtime dir

    def member(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """``argv`` run by another member of the runtime group."""
        done = as_nobody(*argv, groups=(self.gid,))
        assert done.returncode == 0, done
        return done

    def secret_intact(self) -> bool:
        return self.secret.read_text() == SECRET


@pytest.fixture
def shared(runtime_home: Path) -> Iterator[Shared]:
    need_root()
    runtime_home.chmod(0o755)  # the group's members can reach the runtime dir inside
    vault = runtime_home / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    home = runtime_home / "shared"
    env = make_env(home, CROSSINTERCOM_GROUP=SHARED_GROUP)
    settings = settings_for(env)
    ensure_runtime_dir(settings)
    yield Shared(home, env, settings, grp.getgrnam(SHARED_GROUP).gr_gid, secret)


def test_group_dir_is_sticky_so_members_cannot_replace_each_others_files(
    shared: Shared,
) -> None:
    assert stat.S_IMODE(shared.home.stat().st_mode) == 0o1770
    assert stat.S_IMODE(shared.settings.inbox_dir.stat().st_mode) == 0o1770
    owned = shared.home / "broker.log"
    owned.write_text("the owner's\n")
    owned.chmod(0o660)
    os.chown(owned, -1, shared.gid)
    renamed = python_as_nobody(
        "import os, sys; os.rename(sys.argv[1], sys.argv[1] + '.x')",
        str(owned),
        groups=(shared.gid,),
    )
    assert renamed.returncode != 0 and "Operation not permitted" in renamed.stderr, renamed


@pytest.mark.parametrize(
    "name",
    [
        "broker.log",
        "broker.pid",
        "broker.sqlite",
        "broker.sqlite-wal",
        "delivered-messages.sqlite-wal",
    ],
)
def test_symlinked_broker_file_is_refused_not_followed(shared: Shared, name: str) -> None:
    if name.startswith("delivered-messages"):
        # The dedup files exist from an earlier run (a -wal without them is refused anyway);
        # a clean stop removed the -wal, whose name the member then takes.
        assert run_cli(shared.env, "list", "--json").returncode == 0
        pid = broker_pid(shared.home)
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not pid_alive(pid), 20, "the broker to stop")
        assert not (shared.home / name).exists()
    shared.member("ln", "-s", str(shared.secret), str(shared.home / name))
    out = run_cli(shared.env, "list", "--json", timeout=60)
    assert out.returncode != 0
    assert shared.secret_intact(), "a root-only file was written through the symlink"
    # the refusal is named where the person starting it looks
    said = out.stdout + out.stderr
    if name != "broker.log":  # the broker itself refused: its log says why
        said += (shared.home / "broker.log").read_text()
    assert f"refusing to open {shared.home / name}: it is a symlink" in said, said


def test_symlinked_machine_id_is_refused_never_published(shared: Shared) -> None:
    store = shared.home.parent / "store.sqlite"
    migrate.upgrade(f"sqlite:///{store}")
    shared.member("ln", "-s", str(shared.secret), str(shared.home / "machine.id"))
    with pytest.raises(RuntimeDirError, match="it is a symlink"):
        machine_identity(shared.settings)
    env = {**shared.env, "CROSSINTERCOM_STORE": f"sqlite:///{store}"}
    relay = subprocess.run(RELAY, check=False, env=env, capture_output=True, text=True, timeout=60)
    assert relay.returncode != 0
    assert "machine.id: it is a symlink" in relay.stderr, relay.stderr
    db = sqlite3.connect(store)
    try:
        published = db.execute("SELECT machine FROM hosts").fetchall()
    finally:
        db.close()
    assert not any(SECRET.strip() in (m or "") for (m,) in published)


def test_machine_id_of_the_wrong_shape_is_refused(shared: Shared) -> None:
    path = shared.home / "machine.id"
    for bad in ("a secret the member wrote", "x" * 600, "host/0123456789ab\x1b[2J"):
        path.write_text(bad)
        with pytest.raises(RuntimeDirError, match="does not hold a machine identity"):
            machine_identity(shared.settings)
    path.unlink()
    made = machine_identity(shared.settings)
    assert machine_identity(shared.settings) == made
    assert stat.S_IMODE(path.stat().st_mode) == 0o660


def test_planted_token_tmp_does_not_take_the_token(shared: Shared) -> None:
    planted = shared.home / "web.token.tmp"
    shared.member("sh", "-c", f"umask 0; : > {planted}")
    token = "tok-" + os.urandom(8).hex()
    path = write_token_file(shared.home, token)
    assert planted.read_text() == "", "the token went into the member's file"
    assert path.read_text().strip() == token
    # 0600, also after the broker's start-up re-modes the tree
    secure_tree(shared.settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    read = python_as_nobody(
        "import sys; print(open(sys.argv[1]).read())", str(path), groups=(shared.gid,)
    )
    assert read.returncode != 0 and "Permission denied" in read.stderr


@pytest.mark.parametrize("owner", ["member", "self"])
def test_spawn_lock_from_the_future_is_stale(shared: Shared, owner: str) -> None:
    lock = shared.home / "broker.spawn.lock"
    # pid 1 is alive; an hour ahead: no spawn on this clock wrote it
    content = f"1 {time.time() + 3600:.3f}"
    if owner == "member":
        shared.member("sh", "-c", f"umask 0; echo '{content}' > {lock}")
    else:
        lock.write_text(content + "\n")
    started = time.monotonic()
    out = run_cli(shared.env, "list", "--json", timeout=60)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert took < 10, f"the client waited {took:.1f} s behind the planted lock"


def test_members_spawn_lock_the_sticky_dir_keeps_is_passed_by(runtime_home: Path) -> None:
    """The sticky bit binds neither root nor the dir's owner, so here root owns the group dir
    (as the service user does in a host-wide deployment), nobody runs the client and a third
    user of the group plants a lock that looks live: the client cannot remove it and still
    starts the broker at once."""
    need_root()
    runtime_home.chmod(0o755)
    gid = grp.getgrnam(SHARED_GROUP).gr_gid
    home = runtime_home / "shared"
    home.mkdir()
    os.chown(home, 0, gid)
    home.chmod(0o1770)
    lock = home / "broker.spawn.lock"
    planted = as_user(
        OTHER_USER, "sh", "-c", f"umask 0; echo '1 {time.time():.3f}' > {lock}", groups=(gid,)
    )
    assert planted.returncode == 0, planted
    python, env = python_for("nobody", make_env(home, CROSSINTERCOM_GROUP=SHARED_GROUP))
    started = time.monotonic()
    out = as_user(
        "nobody", *python, "-m", "crossintercom", "list", "--json", groups=(gid,), env=env
    )
    took = time.monotonic() - started
    assert out.returncode == 0, out
    assert took < 10, f"the client waited {took:.1f} s behind the member's lock"
    # the sticky bit kept the member's file: the client passed it by rather than removing it
    assert lock.stat().st_uid == pwd.getpwnam(OTHER_USER).pw_uid
    pid = broker_pid(home)
    assert pid is not None and Path(f"/proc/{pid}").stat().st_uid == pwd.getpwnam("nobody").pw_uid


def test_config_json_a_member_wrote_is_refused(shared: Shared) -> None:
    """config.json routes mail and names a password file: one a member planted (its own file,
    or a symlink to one) would send this user's store password wherever the member says."""
    cfg = shared.home / "config.json"
    hostile = '{"store_url": "postgresql://evil@127.0.0.1:1/x", "store_password_file": "%s"}'
    own = shared.home / "members-own.json"
    shared.member("sh", "-c", f"echo '{hostile % shared.secret}' > {own}")
    shared.member("ln", "-s", str(own), str(cfg))
    with pytest.raises(ConfigError, match="it is a symlink"):
        settings_for(shared.env)
    cfg.unlink()
    shared.member("sh", "-c", f"umask 0; cp {own} {cfg}")
    with pytest.raises(ConfigError, match=f"it belongs to uid {pwd.getpwnam('nobody').pw_uid}"):
        settings_for(shared.env)
    out = run_cli(shared.env, "status", "--json")
    assert out.returncode != 0 and f"refusing to read {cfg}" in out.stdout + out.stderr, out
    cfg.unlink()


def test_config_json_the_group_may_write_is_refused_and_kept_unwritable(shared: Shared) -> None:
    cfg = shared.home / "config.json"
    cfg.write_text('{"max_frame_bytes": 123456}')
    cfg.chmod(0o660)  # what the broker's start-up re-moding used to leave
    with pytest.raises(ConfigError, match="others may write it"):
        settings_for(shared.env)
    cfg.chmod(0o640)
    assert settings_for(shared.env).max_frame_bytes == 123456
    secure_tree(shared.settings)
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o640
    assert cfg.stat().st_gid == shared.gid  # members read it
    assert settings_for(shared.env).max_frame_bytes == 123456


@pytest.mark.parametrize("planted", ["agents", "agents/sid.escalations"])
def test_symlinked_agents_dir_gets_no_file_written_through_it(shared: Shared, planted: str) -> None:
    """The agents' dirs hold lock files and escalation records: a member who plants either dir
    as a symlink would have this user's process create files wherever it points."""
    if planted != "agents":
        agents_dir(shared.settings)
    vault = shared.secret.parent
    shared.member("ln", "-s", str(vault), str(shared.home / planted))
    with pytest.raises(RuntimeDirError, match="is not a directory of this runtime dir's"):
        EscalationLog(shared.settings, "sid").remember(new_id(), Escalation.decision("go?"))
    assert sorted(p.name for p in vault.iterdir()) == ["secret"]


def test_escalation_record_a_member_planted_is_not_read(shared: Shared) -> None:
    log = EscalationLog(shared.settings, "sid")
    log.remember("ask-1", Escalation.decision("go?", ["yes", "no"]))
    assert log.lookup("ask-1") is not None
    record = log.dir / "ask-2.json"
    (log.dir / "ask-1.json").rename(record.with_name("ours.json"))
    os.symlink(record.with_name("ours.json"), record)  # a link, as a member would plant
    assert log.lookup("ask-2") is None


def test_symlinked_broker_socket_is_refused_not_connected_to(shared: Shared) -> None:
    """connect() follows a symlink: a member's link at broker.sock would have a client talk to
    any socket the link names, here one only root may reach."""
    private = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    private.bind(str(shared.secret.parent / "private.sock"))
    private.listen(8)
    private.setblocking(False)
    shared.member(
        "ln", "-s", str(shared.secret.parent / "private.sock"), str(shared.home / "broker.sock")
    )
    try:
        out = run_cli(shared.env, "list", "--json", timeout=60)
        with pytest.raises(BlockingIOError):
            private.accept()  # nobody connected to it
    finally:
        private.close()
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert f"refusing to open {shared.home / 'broker.sock'}: it is a symlink" in said, said


def test_symlinked_inbox_file_is_not_read_by_a_viewer(shared: Shared) -> None:
    """The overseer page and inbox search read every inbox file of the dir: one a member
    links to another user's inbox shows nothing of it."""
    vault = shared.secret.parent
    with Inbox(vault, "victim") as box:
        box.save(
            Message(id="m-1", sender=Peer(id="s", name="a", host="h"), to="victim", text=SECRET)
        )
    shared.member(
        "ln", "-s", str(vault / "victim.sqlite"), str(shared.settings.inbox_dir / "x.sqlite")
    )
    with Inbox.view(shared.settings.inbox_dir, "x") as seen:
        assert seen.messages() == []
    with pytest.raises(RuntimeDirError, match="it is a symlink"):
        Inbox.of(shared.settings, "x")


def test_failed_start_never_quotes_a_file_a_member_linked_as_the_log(shared: Shared) -> None:
    """A failed broker start quotes broker.log's last line in the client's error: a member who
    swaps in a link there (its own log, which the sticky dir lets it replace) gets nothing."""
    from crossintercom.local_broker.process.spawn import _tail

    shared.member("ln", "-s", str(shared.secret), str(shared.home / "broker.log"))
    said = _tail(shared.home / "broker.log", shared.gid)
    assert SECRET.strip() not in said
    assert "it is a symlink" in said


def test_a_link_planted_as_a_sender_s_inbox_is_refused_cleanly(
    shared: Shared, caplog: pytest.LogCaptureFixture
) -> None:
    """A member links a file of its own where a session's inbox goes: the session's client
    refuses to save its receipts through it (they stay queued for it) and says why in one
    line, never with an exception out of its event loop; its send itself is unharmed."""
    victim = durable_session_id(shared.settings.host_id, "planner")
    shared.member(
        "ln", "-s", str(shared.secret), str(shared.settings.inbox_dir / f"{victim}.sqlite")
    )
    caplog.set_level(logging.ERROR)
    with (
        Listener(shared.env, "worker"),
        Client(shared.settings, Identity.named(shared.settings, "planner")) as planner,
    ):
        assert planner.send("worker", "hi").outcome.value == "delivered"
        # the worker's listener shows it: a `shown` receipt comes back to the planner
        wait_for(lambda: "cannot save a receipt" in caplog.text, 20, "the refusal said")
    assert "it is a symlink" in caplog.text
    assert "Exception in callback" not in caplog.text, caplog.text
    assert shared.secret_intact()
