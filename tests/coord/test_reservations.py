"""Path reservations across two hosts on both backends (docs/agents.md#path-reservations):
each host's sessions see the other's reservations and conflicts, clashing reserves are refused
with a code, shared ones coexist, and a reservation lapses with its TTL, its release, its
session's forgetting and its host's lease; the pre-commit check's exit code."""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from crossintercom import protocol as p
from crossintercom.client import (
    AsyncClient,
    Client,
    Identity,
    forget,
    reservations,
    reserve,
    unreserve,
)
from tests.conftest import cli_json, run_cli
from tests.relay.conftest import CLI, Cluster, Host, wait_for

T = TypeVar("T")

P = "git.example.org/team/app"
FAST = {"lease_s": 2, "heartbeat_s": 0.5, "housekeeping_s": 1}


def _run(host: Host, name: str | None, fn: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """One operation as the durable session NAME (None: a one-off session), in this process:
    the CLI's own surface is checked where it matters, the rest goes faster this way."""
    ident = host.identity(name) if name else Identity.ephemeral()
    with Client(host.settings, ident, mode="auto", reconnect=False).connect() as client:
        return client.run(fn)


def _reserve(host: Host, name: str, *globs: str, **kw: Any) -> p.ReservationList:
    return _run(host, name, functools.partial(reserve, project=P, globs=globs, **kw))


def _seen(host: Host) -> list[tuple[str, str]]:
    state = _run(host, None, functools.partial(reservations, project=P))
    return [(r.glob, f"{r.name}@{r.host}") for r in state.items]


def test_two_hosts_see_each_others_reservations_and_conflicts(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    made = a.cli_json("reserve", "--as", "alice", "--project", P, "--reason", "refactor", "src/**")
    assert [(r["glob"], r["mode"], r["holder"]) for r in made["reserved"]] == [
        ("src/**", "exclusive", "alice@A")
    ]
    assert _seen(b) == [("src/**", "alice@A")]  # the store is the authority: no waiting
    listed = b.cli("reservations", "--all-projects").stdout
    assert listed.startswith(f"{P}: src/** exclusive by alice@A, ") and "refactor" in listed

    # B's conflict check (a pre-commit hook's): exit 3 and a readable list
    found = b.cli_json(
        "reservations", "--project", P, "--conflicts", "src/x.py", "README", expect_rc=3
    )
    assert [(c["path"], c["glob"], c["holder"]) for c in found["conflicts"]] == [
        ("src/x.py", "src/**", "alice@A")
    ]
    text = b.cli("reservations", "--project", P, "--conflicts", "src/x.py", "docs/a.md")
    assert text.returncode == 3, text.stderr
    assert text.stdout.startswith("src/x.py: src/** exclusive by alice@A, ")
    assert text.stdout.rstrip().endswith(": refactor") and "docs/a.md" not in text.stdout
    # none for a path nobody holds, nor for the holder's own
    assert b.cli("reservations", "--project", P, "--conflicts", "docs/a.md").returncode == 0
    mine = a.cli("reservations", "--as", "alice", "--project", P, "--conflicts", "src/x.py")
    assert mine.returncode == 0 and "no conflicts" in mine.stdout

    # B's exclusive reserve is refused with a code, and nothing of it is reserved
    refused = b.cli_json(
        "reserve", "--as", "bob", "--project", P, "docs/**", "src/x.py", expect_rc=3
    )
    assert refused["error"]["code"] == "reservation_conflict"
    assert "alice@A" in refused["error"]["message"]
    assert [c["holder"] for c in refused["conflicts"]] == ["alice@A"]
    assert _seen(a) == [("src/**", "alice@A")]

    # shared with shared coexist; exclusive against them does not
    assert _reserve(a, "alice", "docs/**", mode="shared").code is None
    assert _reserve(b, "bob", "docs/api.md", mode="shared").code is None
    clash = _reserve(b, "carol", "docs/api.md")
    assert clash.code == "reservation_conflict"
    assert sorted(f"{r.name}@{r.host}" for r in clash.conflicts) == ["alice@A", "bob@B"]


def test_reservations_lapse_by_release_ttl_forget_and_the_hosts_lease(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", A=FAST, B=FAST)
    _reserve(a, "alice", "src/**")
    _reserve(a, "alice", "lib/**")
    _reserve(b, "bob", "docs/**", ttl_s=2)
    _reserve(b, "bob2", "tests/**")
    assert len(_seen(a)) == 4

    gone = _run(a, "alice", functools.partial(unreserve, project=P, globs=["lib/**"]))
    assert gone.released == 1 and [r.glob for r in gone.items] == ["src/**"]
    # a TTL lapses, wherever it is read
    wait_for(lambda: ("docs/**", "bob@B") not in _seen(a), 30, "bob's TTL to lapse")
    # forgetting the holder ends its reservations
    _run(b, None, functools.partial(forget, session_id=b.session_id("bob2")))
    wait_for(lambda: ("tests/**", "bob2@B") not in _seen(a), 30, "bob2's to go with it")
    assert _seen(b) == [("src/**", "alice@A")]

    # A's relay stops: A's sessions cannot reserve (a code naming the fix), and once A's
    # lease lapses its reservations no longer count on B, which may take the paths
    a.stop_relay()
    down = a.cli_json("reserve", "--as", "alice", "--project", P, "lib/**", expect_rc=1)
    assert down["error"]["code"] == "relay_not_running"
    assert "crossintercom relay" in down["error"]["message"]
    wait_for(lambda: _seen(b) == [], 30, "A's lease to lapse")
    assert _reserve(b, "bob", "src/x.py").code is None


def _in(host: Any, cwd: Path, *args: str, rc: int = 0) -> Any:
    out = subprocess.run(
        [*CLI, *args, "--json"],
        env=host.env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == rc, (out.returncode, out.stdout, out.stderr)
    return json.loads(out.stdout)


def test_checkouts_of_one_repository_share_a_project_key(
    sqlite_cluster: Cluster, tmp_path: Path
) -> None:
    """The default project key: the origin remote, normalised, so an ssh checkout on one host
    and an https one on another share reservations; paths are taken relative to where the
    command runs, as a hook's are. (The key is the client's: one backend is enough.)"""
    a, b = sqlite_cluster.up("A", "B")
    ssh, https = tmp_path / "ssh", tmp_path / "https"
    for where, url in (
        (ssh, "git@Example.org:team/app.git"),
        (https, "https://example.org/team/app"),
    ):
        (where / "src").mkdir(parents=True)
        subprocess.run(["git", "init", "-q", str(where)], check=True)
        subprocess.run(["git", "-C", str(where), "remote", "add", "origin", url], check=True)
    made = _in(a, ssh, "reserve", "--as", "alice", "src/")
    assert made["project"] == "example.org/team/app"
    assert [r["glob"] for r in made["reserved"]] == ["src/**"]
    found = _in(b, https / "src", "reservations", "--conflicts", "x.py", rc=3)
    assert found["project"] == "example.org/team/app"
    assert [(c["path"], c["holder"]) for c in found["conflicts"]] == [("src/x.py", "alice@A")]
    assert _in(b, https, "reservations", "--conflicts", "README.md")["conflicts"] == []
    outside = subprocess.run(
        [*CLI, "reservations"], env=b.env, cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert outside.returncode == 2 and "--project" in outside.stderr


def test_a_bad_glob_is_a_usage_error_before_any_relay_is_asked(cli_env: dict[str, str]) -> None:
    """No relay runs here: each bad glob is refused by the command itself, exit 2, the glob
    shortened and its controls escaped in the message."""
    for bad in ("/etc/passwd", "../up", "a//b", "x\x1b[2J", "n" * 100_000, ""):
        out = run_cli(cli_env, "reserve", "--as", "w", "--project", "p", bad)
        assert out.returncode == 2, (bad[:20], out)
        assert "Invalid value for GLOB" in out.stderr and len(out.stderr) < 600, out.stderr
        assert "\x1b" not in out.stderr
    error = cli_json(cli_env, "reserve", "--as", "w", "--project", "p", "../up", expect_rc=2)
    assert error["error"]["code"] == "invalid_argument"
