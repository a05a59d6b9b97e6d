"""Path reservations across two hosts on both backends (docs/agents.md#path-reservations):
each host's sessions see the other's reservations and conflicts, clashing reserves are refused
with a code, shared ones coexist, and a reservation lapses with its TTL, its release, its
session's forgetting and its host's lease; the pre-commit check's exit code."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.relay.conftest import CLI, Cluster, wait_for

P = "git.example.org/team/app"
FAST = {"lease_s": 2, "heartbeat_s": 0.5, "housekeeping_s": 1}


def _globs(host: Any, *extra: str) -> list[tuple[str, str]]:
    rows = host.cli_json("reservations", "--project", P, *extra)["reservations"]
    return [(r["glob"], r["holder"]) for r in rows]


def test_two_hosts_share_reservations_and_conflicts(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", A=FAST, B=FAST)
    made = a.cli_json("reserve", "--as", "alice", "--project", P, "--reason", "refactor", "src/**")
    assert [(r["glob"], r["mode"], r["holder"]) for r in made["reserved"]] == [
        ("src/**", "exclusive", "alice@A")
    ]
    assert _globs(b) == [("src/**", "alice@A")]  # the store is the authority: no waiting

    # B's conflict check (a pre-commit hook's): exit 3 and a readable list
    found = b.cli_json(
        "reservations", "--project", P, "--conflicts", "src/x.py", "README", expect_rc=3
    )
    assert [(c["path"], c["glob"], c["holder"]) for c in found["conflicts"]] == [
        ("src/x.py", "src/**", "alice@A")
    ]
    text = b.cli("reservations", "--project", P, "--conflicts", "src/x.py")
    assert text.returncode == 3 and "src/x.py: src/** exclusive by alice@A" in text.stdout
    assert "refactor" in text.stdout
    assert b.cli("reservations", "--project", P, "--conflicts", "docs/a.md").returncode == 0
    # the holder's own reservation is no conflict for it
    assert (
        a.cli("reservations", "--as", "alice", "--project", P, "--conflicts", "src/x.py").returncode
        == 0
    )

    # B's exclusive reserve is refused with a code, nothing reserved
    refused = b.cli_json(
        "reserve", "--as", "bob", "--project", P, "docs/**", "src/x.py", expect_rc=3
    )
    assert refused["error"]["code"] == "reservation_conflict"
    assert [c["holder"] for c in refused["conflicts"]] == ["alice@A"]
    assert _globs(a) == [("src/**", "alice@A")]

    # shared with shared coexist; exclusive against them does not
    a.cli_json("reserve", "--as", "alice", "--project", P, "--shared", "docs/**")
    b.cli_json("reserve", "--as", "bob", "--project", P, "--shared", "docs/api.md")
    b.cli_json("reserve", "--as", "carol", "--project", P, "docs/api.md", expect_rc=3)

    # release, then the glob is free for B
    gone = a.cli_json("unreserve", "--as", "alice", "--project", P, "src/**")
    assert gone["released"] == 1
    brief = b.cli_json("reserve", "--as", "bob", "--project", P, "--ttl", "2s", "src/x.py")
    assert {r["glob"] for r in brief["reserved"]} == {"docs/api.md", "src/x.py"}
    # a TTL lapses
    wait_for(lambda: ("src/x.py", "bob@B") not in _globs(a), 30, "the TTL to lapse")

    # forgetting the holder lapses its reservations
    assert ("docs/api.md", "bob@B") in _globs(a)
    b.cli_json("forget", "bob")
    wait_for(lambda: ("docs/api.md", "bob@B") not in _globs(a), 30, "bob's to go with it")

    # A's relay stops: A's sessions cannot reserve (a code naming the fix), and once A's
    # lease lapses its reservations no longer count on B
    a.stop_relay()
    down = a.cli_json("reserve", "--as", "alice", "--project", P, "lib/**", expect_rc=1)
    assert down["error"]["code"] == "relay_not_running"
    assert "crossintercom relay" in down["error"]["message"]
    wait_for(lambda: _globs(b) == [], 30, "A's lease to lapse")
    b.cli_json("reserve", "--as", "bob2", "--project", P, "docs/**")


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


def test_checkouts_of_one_repository_share_a_project_key(cluster: Cluster, tmp_path: Path) -> None:
    """The default project key: the origin remote, normalised, so an ssh checkout on one host
    and an https one on another share reservations; paths are taken relative to where the
    command runs, as a hook's are."""
    a, b = cluster.up("A", "B")
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
