"""Reservation floods (docs/agents.md#path-reservations): a session that reserves without end is
refused by its quota and its rate of coordination requests, each with its own code; and a
writer of the store that planted thousands of rows (a megabyte reason among them) leaves
every other host's lists, conflict checks and reserves answering within the frame limit, its
relay link up and its mail flowing."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.relay.conftest import Cluster

P = "git.example.org/team/app"


def test_a_session_s_flood_meets_its_quota_then_its_rate(cluster: Cluster) -> None:
    (a,) = cluster.up("A", A={"coord_rate_count": 3, "reservation_max_per_session": 150})
    args = ("reserve", "--as", "mallory", "--project", P)
    made = a.cli_json(*args, *(f"f/{i}" for i in range(100)))
    assert len(made["reserved"]) == 100
    over = a.cli_json(*args, *(f"g/{i}" for i in range(100)), expect_rc=1)
    assert over["error"]["code"] == "reservation_quota", over
    assert "quota is 150" in over["error"]["message"]
    a.cli_json("unreserve", "--as", "mallory", "--project", P, "f/1")
    limited = a.cli_json(*args, "h/1", expect_rc=1)
    assert limited["error"]["code"] == "coord_rate_limited", limited
    # a policy change counts too; reading the policy does not
    policy = a.cli_json("inbound", "--as", "mallory", "pest@A", "refuse", expect_rc=1)
    assert policy["error"]["code"] == "coord_rate_limited", policy
    assert a.cli_json("inbound", "--as", "mallory")["rules"] == {}
    # listing is no change: still answered, and the quota held all or none
    listed = a.cli_json("reservations", "--project", P)
    assert len(listed["reservations"]) == 99 and listed["more"] is False


def _flood(store: Path, host: str, session: str, rows: int) -> None:
    """A writer of the file plants ``rows`` reservations for ``host``'s session at its current
    generation, each as large as a relay allows, and one with a 9 MiB reason."""
    now = datetime.now(UTC)
    at, until = str(now), str(now + timedelta(days=20))
    with sqlite3.connect(store) as db:
        (gen,) = db.execute("SELECT generation FROM hosts WHERE host_id = ?", (host,)).fetchone()
        big = [(f"flood-{i}", f"flood/{i}/" + "x" * 480, "r" * 500) for i in range(rows)]
        db.executemany(
            "INSERT INTO reservations (id, project, glob, mode, host_id, session_id, "
            "generation, reason, created, expires_at) VALUES (?, ?, ?, 'shared', ?, ?, ?, ?, "
            "?, ?)",
            [(i, P, g, host, session, gen, r, at, until) for i, g, r in big]
            + [("huge", P, "huge/**", host, session, gen, "r" * (9 << 20), at, until)],
        )


def test_a_planted_flood_leaves_every_answer_inside_the_frame(sqlite_cluster: Cluster) -> None:
    small = {"max_frame_bytes": 512 * 1024.0}
    a, b, worker = sqlite_cluster.worker_on_b(A=small, B=small)
    b.cli_json("reserve", "--as", "bob", "--project", P, "--reason", "mine", "src/**")
    a.cli_json("reserve", "--as", "alice", "--project", P, "docs/**")
    store = Path(sqlite_cluster.store_url.removeprefix("sqlite:///"))
    _flood(store, "A", a.session_id("alice"), 1500)

    listed = b.cli_json("reservations", "--project", P)
    assert listed["more"] is True and 0 < len(listed["reservations"]) < 1000
    assert "huge/**" not in {r["glob"] for r in listed["reservations"]}
    assert ("src/**", "bob@B") in {(r["glob"], r["holder"]) for r in listed["reservations"]}
    everything = b.cli("reservations", "--all-projects")
    assert everything.returncode == 0 and "more than one answer carries" in everything.stderr
    found = b.cli_json("reservations", "--project", P, "--conflicts", "docs/x.md", expect_rc=3)
    assert [c["holder"] for c in found["conflicts"]] == ["alice@A"]
    made = b.cli_json("reserve", "--as", "bob", "--project", P, "lib/**")
    assert {r["glob"] for r in made["reserved"]} == {"src/**", "lib/**"}
    # the relay link stayed up: mail still goes both ways
    sent = a.cli_json("send", "--to", "worker", "after the flood")
    assert sent["outcome"] == "delivered", sent
    assert worker.next_message()["id"] == sent["id"]


def test_a_planted_roster_flood_keeps_the_link_and_the_mail(sqlite_cluster: Cluster) -> None:
    """20,000 sessions of one host (12 MB of roster, each row within its bounds), planted by a
    writer of the file: every other relay reads that host's first 1,000, its broker's roster
    frame stays under the limit, and mail between the real hosts flows."""
    a, b, worker = sqlite_cluster.worker_on_b()
    _plant_roster(sqlite_cluster)
    a.wait_sees("f00999", "F", online=False)
    sent = a.cli_json("send", "--to", "worker", "after the roster flood")
    assert sent["outcome"] == "delivered", sent
    assert worker.next_message()["id"] == sent["id"]
    listed = b.cli_json("list")
    assert sum(s["host"] == "F" for s in listed) == 1000


def test_a_roster_over_one_frame_is_cut_to_fit(sqlite_cluster: Cluster) -> None:
    """With a smaller frame, even each host's first 1,000 sessions do not fit: the roster a
    relay hands its broker is cut to fit (sorted by host, so the real hosts' come first) and
    the link stays up."""
    small = {"max_frame_bytes": 256 * 1024.0}
    a, _, worker = sqlite_cluster.worker_on_b(A=small, B=small)
    _plant_roster(sqlite_cluster)
    a.wait_sees("f00100", "F", online=False)
    assert not a.sees("f00999", "F", online=False)
    sent = a.cli_json("send", "--to", "worker", "after the cut roster")
    assert sent["outcome"] == "delivered", sent
    assert worker.next_message()["id"] == sent["id"]


def _plant_roster(cluster: Cluster) -> None:
    store = Path(cluster.store_url.removeprefix("sqlite:///"))
    with sqlite3.connect(store) as db:
        db.execute(
            "INSERT INTO hosts (host_id, generation, heartbeat, roster_rev) VALUES ('F', 1, 1, 1)"
        )
        db.executemany(
            "INSERT INTO roster (host_id, session_id, name, cwd, purpose, groups, durable, "
            "online) VALUES ('F', ?, ?, ?, 'agent', '[]', 0, 1)",
            [(f"f{i:05}", f"f{i:05}", "/" + "d" * 599) for i in range(20_000)],
        )
