"""Name retirement across two hosts on both backends: a durable name idle past its
retirement age is retired as `forget` would, its queued mail expiring with receipts to its
senders (and so listed in their dead letters); a name in use is never retired."""

from __future__ import annotations

import functools

from tests.relay.conftest import Cluster, Host, wait_for


def test_an_idle_name_is_retired_with_receipts(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", B={"retire_idle_s": 8, "sweep_interval_s": 0.5})
    a.listen("planner")
    busy = b.listen("busy")  # held all along: never idle
    b.cli("wait", "--as", "worker", "--timeout", "0")  # known on B, then away
    a.wait_sees("worker", "B", online=False)
    queued = a.cli_json("send", "--as", "planner", "--to", "worker", "for later")
    assert queued["outcome"] == "queued"

    rows = wait_for(lambda: a.cli_json("dead-letters", "--as", "planner"), 60, "the retirement")
    assert [(r["id"], r["outcome"], r["code"]) for r in rows] == [
        (queued["id"], "expired", "forgotten")
    ]
    wait_for(lambda: not b.sees("worker", "B", online=False), 30, "worker to leave the roster")
    assert b.sees("busy", "B")
    sent = a.cli_json("send", "--as", "planner", "--to", "busy", "still here?")
    assert sent["outcome"] == "delivered"
    assert busy.next_message()["id"] == sent["id"]


def _held(host: Host, name: str) -> list[str]:
    return [h["id"] for h in host.cli_json("inbound", "--as", name)["held"]]


def _holds(host: Host, name: str, mid: str) -> bool:
    return _held(host, name) == [mid]


def test_forget_and_retirement_take_the_names_rules_and_held_mail(cluster: Cluster) -> None:
    """Held mail belongs to the name: `forget` (and retirement, which forgets) tells its senders
    (`expired`, code `forgotten`), drops the rules, and the next session of that name neither
    inherits the rules nor can release the mail; held mail left alone expires as queued mail."""
    a, b = cluster.up("A", "B", B={"retire_idle_s": 8, "sweep_interval_s": 0.5})
    a.listen("planner")
    b.listen("busy")
    for name in ("worker", "idle"):
        b.cli_json("inbound", "--as", name, "planner@A", "hold")
        a.wait_sees(name, "B", online=False)
    held = {
        name: a.cli_json("send", "--as", "planner", "--to", f"{name}@B", f"for {name}")["id"]
        for name in ("worker", "idle")
    }
    for name, mid in held.items():
        wait_for(functools.partial(_holds, b, name, mid), 30, f"{name}'s hold")

    assert b.cli_json("forget", "worker")["expired"] == 1

    def dead() -> dict[str, tuple[str, str]]:
        rows = a.cli_json("dead-letters", "--as", "planner")
        return {r["id"]: (r["outcome"], r["code"]) for r in rows}

    # `forget` at once, the idle name by its retirement.
    wait_for(lambda: len(dead()) == 2, 60, "both senders' receipts")
    assert dead() == dict.fromkeys(held.values(), ("expired", "forgotten"))
    for name in ("worker", "idle"):
        # A new session of the name: no rules, nothing to release, mail comes straight in.
        state = b.cli_json("inbound", "--as", name)
        assert (state["rules"], state["held"]) == ({}, []), (name, state)
        out = b.cli("release", "--as", name, held[name])
        assert out.returncode == 2, out
        sink = b.listen(name)
        a.wait_sees(name, "B")
        sent = a.cli_json("send", "--as", "planner", "--to", f"{name}@B", "again")
        assert sent["outcome"] == "delivered"
        assert sink.next_message()["id"] == sent["id"]
        assert held[name] not in b.inbox(name)


def test_held_mail_expires_like_queued_mail(cluster: Cluster) -> None:
    a, b = cluster.up("A", "B", B={"retention_s": 3, "sweep_interval_s": 0.5})
    a.listen("planner")
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    b.cli_json("inbound", "--as", "worker", "planner@A", "hold")
    sent = a.cli_json("send", "--as", "planner", "--to", "worker@B", "held, then gone")
    assert sent["outcome"] == "queued"
    rows = wait_for(lambda: a.cli_json("dead-letters", "--as", "planner"), 60, "the expiry")
    assert [(r["id"], r["outcome"], r["code"]) for r in rows] == [
        (sent["id"], "expired", "expired")
    ]
    assert _held(b, "worker") == []
    worker.no_message()
