"""Inbound policy across two hosts on both backends: a refused sender gets its own code, a
held sender's mail waits unshown until released, rules are durable and shown."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

from tests.conftest import kill_broker
from tests.relay.conftest import Cluster, wait_for


def test_refuse_and_hold_senders_across_hosts(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B")
    worker = b.listen("worker")
    a.listen("planner")
    a.listen("pest")
    a.wait_sees("worker", "B")
    b.wait_sees("planner", "A")
    state = b.cli_json("inbound", "--as", "worker", "pest@A", "refuse")
    assert state["rules"] == {"pest@A": "refuse"}
    b.cli_json("inbound", "--as", "worker", "*@A", "hold")

    refused = a.cli_json("send", "--as", "pest", "--to", "worker", "buy now", expect_rc=3)
    assert (refused["error"]["outcome"], refused["error"]["code"]) == ("refused", "sender_refused")
    # The row crossing the store has a code and no text: the sender's side words it.
    assert refused["error"]["message"] == "the recipient does not take mail from this sender"
    held = a.cli_json("send", "--as", "planner", "--to", "worker", "plan v2")
    assert held["outcome"] == "queued"
    state = wait_for(
        lambda: (s := b.cli_json("inbound", "--as", "worker"))["held"] and s, 30, "the hold"
    )
    assert [(h["id"], h["from"]) for h in state["held"]] == [(held["id"], "planner@A")]
    worker.no_message()  # held: not delivered to the listener, so not shown
    assert b.inbox("worker")[held["id"]] == 0
    shown = b.cli_json("status")["inbound"]["worker"]
    assert shown == {"rules": {"*@A": "hold", "pest@A": "refuse"}, "held": 1}
    assert "worker: " in b.cli("status").stdout

    # Rules are kept across a broker restart.
    worker.stop()
    kill_broker(b.home)
    assert b.cli_json("inbound", "--as", "worker")["rules"] == {
        "pest@A": "refuse",
        "*@A": "hold",
    }
    worker = b.listen("worker")
    released = b.cli_json("release", "--as", "worker", held["id"])
    assert released["released"] == 1 and released["held"] == []
    got = worker.next_message()
    assert (got["id"], got["message"]) == (held["id"], "plan v2")

    b.cli_json("inbound", "--as", "worker", "--remove", "*@A")
    sent = a.cli_json("send", "--as", "planner", "--to", "worker", "now direct")
    assert sent["outcome"] == "delivered"
    assert worker.next_message()["id"] == sent["id"]
    bad = b.cli("inbound", "--as", "worker", "not a pattern!", "hold", "--json")
    assert bad.returncode != 0


def test_bad_patterns_and_unknown_ids_are_usage_errors(cluster: Cluster) -> None:
    """A pattern the broker refuses exits 2 with the pattern shortened; releasing an id that is
    not held says so and releases nothing; `release` always says how many it released."""
    (a,) = cluster.up("A")
    a.listen("planner")
    a.cli_json("inbound", "--as", "worker", "planner", "hold")
    held = a.cli_json("send", "--as", "planner", "--to", "worker", "wait for me")
    for bad in ("x@", "group:", "**", "bad\x1b[31m", "n" * 5000):
        out = a.cli("inbound", "--as", "worker", bad, "refuse")
        assert out.returncode == 2, (bad[:20], out)
        assert "is not NAME, NAME@HOST" in out.stderr and len(out.stderr) < 300, out.stderr
        assert "\x1b" not in out.stderr
    bogus = a.cli("release", "--as", "worker", held["id"], "no-such-id\x1b[2J")
    assert bogus.returncode == 2 and "no held message no-such-id" in bogus.stderr, bogus
    assert "\x1b" not in bogus.stderr
    state = a.cli_json("inbound", "--as", "worker")
    assert [h["id"] for h in state["held"]] == [held["id"]]
    out = a.cli("release", "--as", "worker", held["id"])
    assert out.returncode == 0 and "released 1" in out.stdout, out
    assert "released 0" in a.cli("release", "--as", "worker", "--all").stdout


# Host ids no session name could be: the default USER@HOSTNAME shape with a port-like suffix,
# and one past a name's 64 characters.
ODD_HOSTS = ("dev@build-box:7", "ops@" + "h" * 90)


def test_rules_name_any_valid_host_id(cluster: Cluster) -> None:
    """`NAME@HOST` and `*@HOST` take every host id a host may have, so a host with the default
    id can be refused (the senders are hostile sessions on those hosts)."""
    (b,) = cluster.up("B")
    senders = [cluster.host(h, dirname=f"s{i}") for i, h in enumerate(ODD_HOSTS)]
    worker = b.listen("worker")
    for h in senders:
        h.listen("pest")
        h.wait_sees("worker", "B")
        b.wait_sees("pest", h.host_id)
    first, second = ODD_HOSTS
    b.cli_json("inbound", "--as", "worker", f"*@{first}", "refuse")
    b.cli_json("inbound", "--as", "worker", f"pest@{second}", "refuse")
    assert b.cli_json("inbound", "--as", "worker")["rules"] == {
        f"*@{first}": "refuse",
        f"pest@{second}": "refuse",
    }
    for h in senders:
        out = h.cli_json("send", "--as", "pest", "--to", "worker@B", "buy now", expect_rc=3)
        assert out["error"]["code"] == "sender_refused", (h.host_id, out)
    worker.no_message()
    # A host id is checked as one: a blank or a `/` in it is still no pattern.
    for bad in ("*@dev box", "pest@a/b", "*@"):
        assert b.cli("inbound", "--as", "worker", bad, "refuse").returncode == 2, bad


def test_a_group_is_no_allowlist(cluster: Cluster) -> None:
    """Anyone may join a group, so `* refuse` with `group:trusted accept` would admit whoever
    joins: the accept is refused as a usage error, a group may still be held or refused, and an
    accept kept in the broker's file from before is passed over."""
    a, b, worker = cluster.worker_on_b()
    b.cli_json("inbound", "--as", "worker", "*", "refuse")
    out = b.cli("inbound", "--as", "worker", "group:trusted", "accept")
    assert out.returncode == 2 and "anyone may join a group" in out.stderr, out
    assert b.cli_json("inbound", "--as", "worker")["rules"] == {"*": "refuse"}

    # The attacker joins the group and tries its luck, with a rule planted as if kept.
    with sqlite3.connect(b.home / "broker.sqlite") as db:
        db.execute(
            "INSERT INTO inbound_rules (session, pattern, action) VALUES (?, 'group:trusted', "
            "'accept')",
            (b.session_id("worker"),),
        )
    worker.stop()
    kill_broker(b.home)  # the rules are read afresh
    worker = b.listen("worker")
    a.listen("intruder")
    a.cli_json("join", "--as", "intruder", "trusted")
    wait_for(
        lambda: any(g["name"] == "trusted" and g["members"] for g in b.cli_json("groups")),
        30,
        "B to see the intruder in the group",
    )
    refused = a.cli_json("send", "--as", "intruder", "--to", "worker@B", "let me in", expect_rc=3)
    assert refused["error"]["code"] == "sender_refused"
    worker.no_message()

    # A group may be refused by name while the rest is accepted.
    b.cli_json("inbound", "--as", "worker", "--remove", "*")
    b.cli_json("inbound", "--as", "worker", "group:trusted", "refuse")
    again = a.cli_json("send", "--as", "intruder", "--to", "worker@B", "again", expect_rc=3)
    assert again["error"]["code"] == "sender_refused"


def test_a_reply_passes_the_policy_once_across_hosts(cluster: Cluster) -> None:
    """A session the recipient refuses (or holds) was once asked something: it may answer that
    ask once, and every further "reply" naming it from its host is `already_replied`, urgent
    or not, as a second reply on one host is; mail without the ask is still refused."""
    a, b, worker = cluster.worker_on_b()
    pest = a.client("pest")
    b.wait_sees("pest", "A")
    b.cli_json("inbound", "--as", "worker", "pest@A", "refuse")
    asker = b.client("asker")
    b.cli_json("inbound", "--as", "asker", "pest@A", "hold")
    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.append(asker.ask("pest@A", "which port?", timeout=60)),
        daemon=True,
    )
    thread.start()
    got = pest.next_incoming(timeout=30)
    assert got is not None and got.message is not None and got.message.expects_reply
    ask_id = got.message.id

    # The hostile session answers with plain sends naming the ask: the first is the answer.
    first = pest.send("asker@B", "8080", reply_to=ask_id)
    assert first.outcome.value == "delivered", first
    thread.join(30)
    assert results and results[0].reply is not None and results[0].reply.text == "8080"
    extra = []
    for priority in ("normal", "urgent"):
        again = pest.send("asker@B", f"obey ({priority})", reply_to=ask_id, priority=priority)
        assert (again.outcome.value, again.code) == ("refused", "already_replied"), again
        extra.append(again.id)
    # Its host's own `reply` is refused by the asker's host the same way.
    out = a.cli_json("reply", "--as", "pest", "--reply-to", ask_id, "late", expect_rc=3)
    assert out["error"]["code"] == "already_replied", out
    # Nothing more reached the asker: not held, not saved.
    assert b.cli_json("inbound", "--as", "asker")["held"] == []
    assert not set(extra) & set(b.inbox("asker"))
    # Without an ask, the refusal and the hold stand.
    refused = pest.send("worker@B", "buy now")
    assert (refused.outcome.value, refused.code) == ("refused", "sender_refused")
    held = pest.send("asker@B", "buy now", reply_to="no-such-ask")
    assert held.outcome.value == "queued"
    worker.no_message()


def test_every_path_into_a_session_passes_its_policy(cluster: Cluster) -> None:
    """A refused sender tries the other ways in: a group the recipient is in, and a resend of
    its refused message; each is refused as a send is."""
    a, b, worker = cluster.worker_on_b()
    b.cli_json("join", "--as", "worker", "crew")
    a.listen("pest")
    b.wait_sees("pest", "A")
    b.cli_json("inbound", "--as", "worker", "pest@A", "refuse")
    wait_for(
        lambda: any(g["name"] == "crew" and g["members"] for g in a.cli_json("groups")),
        30,
        "A to see the group",
    )
    group = a.cli_json("send", "--as", "pest", "--to", "group:crew", "to all", expect_rc=3)
    assert [(r["recipient"], r["code"]) for r in group["error"]["receipts"]] == [
        (b.session_id("worker"), "sender_refused")
    ], group
    first = a.cli_json("send", "--as", "pest", "--to", "worker@B", "direct", expect_rc=3)
    wait_for(
        lambda: (
            first["error"]["id"] in {d["id"] for d in a.cli_json("dead-letters", "--as", "pest")}
        ),
        30,
        "the refused send among the dead letters",
    )
    again = a.cli_json("resend", "--as", "pest", "--json", first["error"]["id"], expect_rc=3)
    assert again["error"]["code"] == "sender_refused", again
    worker.no_message()
