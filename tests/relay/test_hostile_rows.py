"""Hostile or buggy rows in the shared store, written directly by a rogue with database access.

Each bad row is refused once with a logged reason (its delivery finished as ``refused`` with a
code), never retried, never handed to a listener, and never blocks the rows behind it: a canary
sent after 500 bad rows arrives at once. Nothing crashes: relay, broker and listener live on.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from crossintercom.models import new_id
from tests.relay.conftest import Cluster, wait_for
from tests.relay.rogue import Rogue, message


@pytest.fixture
def rogue(store_url: str) -> Iterator[Rogue]:
    r = Rogue(store_url)
    try:
        yield r
    finally:
        r.close()


# (kind, what _payload builds, the code the row must be refused with)
KINDS: list[tuple[str, Any, str]] = [
    ("string", "just a string", "bad_message"),
    ("null", None, "bad_message"),
    ("array", [1, 2, 3], "bad_message"),
    ("id_object", {"id": {"x": 1}}, "bad_message"),
    ("reply_to_object", "reply_to", "bad_message"),
    ("text_number", "text", "bad_message"),
    ("id_mismatch", "mismatch", "bad_message"),
    ("forged_host", "forged_host", "forged_sender"),
    ("claims_other_hosts_session", "other_session", "forged_sender"),
    ("claims_victims_own_session", "own_session", "forged_sender"),
    ("claims_victims_host", "victim_host", "forged_sender"),
]


def _payload(kind: str, spec: Any, mid: str, a_session: str, b_session: str) -> tuple[Any, str]:
    """The payload for one row of ``kind`` and the host that writes it."""
    rogue_host = "R"
    if not isinstance(spec, str) or kind == "string":
        return spec, rogue_host
    if spec == "reply_to":
        return message(new_id(), rogue_host, mid=mid, reply_to={"not": "an id"}), rogue_host
    if spec == "text":
        return message(new_id(), rogue_host, mid=mid, message=12345), rogue_host
    if spec == "mismatch":
        return message(new_id(), rogue_host, mid=new_id()), rogue_host
    if spec == "forged_host":
        return message(new_id(), "A", mid=mid), rogue_host
    if spec == "other_session":
        return message(a_session, rogue_host, mid=mid), rogue_host
    if spec == "own_session":
        return message(b_session, rogue_host, mid=mid), rogue_host
    assert spec == "victim_host"
    return message(new_id(), "B", mid=mid), "B"


def test_bad_rows_refused_once_without_blocking_a_canary(
    cluster: Cluster, rogue: Rogue, backend: str
) -> None:
    a, b = cluster.up("A", "B", A={"remote_ack_wait_s": 10})
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")
    b_other = b.client("other")  # a session on the victim's own host
    a.wait_sees("other", "B")
    b.wait_sees("planner", "A")
    a_session, b_session = a.session_id("planner"), b.session_id("other")
    target = b.session_id("worker")

    expected: dict[str, str] = {}
    kinds = itertools.cycle(KINDS)
    by_host: dict[str, list[tuple[str, Any]]] = {}
    for _ in range(499):
        kind, spec, code = next(kinds)
        mid = new_id()
        payload, writer = _payload(kind, spec, mid, a_session, b_session)
        by_host.setdefault(writer, []).append((mid, payload))
        expected[mid] = code
    # over the frame limit (8 MiB): never read into memory, refused as too large
    huge = new_id()
    by_host["R"].append((huge, message(new_id(), "R", mid=huge, message="x" * (12 << 20))))
    expected[huge] = "too_large"
    for writer, rows in by_host.items():
        rogue.insert(rows, sender_host=writer, recipient_host="B", recipient_session=target)
    if backend == "sqlite":
        broken = new_id()
        rogue.insert_raw_sqlite_payload(
            broken, '{"id": "unterminated', sender_host="R", recipient_host="B", session=target
        )
        expected[broken] = "bad_message"
    assert len(expected) >= 500

    started = time.monotonic()
    canary = planner.send("worker@B", "canary behind the bad rows")
    took = time.monotonic() - started
    assert canary.outcome.value == "delivered", (canary, took)
    wait_for(lambda: canary.id in worker.message_ids(), 20, "the canary to be printed")

    def all_refused() -> bool:
        states = rogue.states(list(expected))
        return all(states.get(mid, ("queued", None))[0] == "refused" for mid in expected)

    wait_for(all_refused, 30, "every bad row to be refused")
    states = rogue.states(list(expected))
    wrong = {mid: (states[mid], want) for mid, want in expected.items() if states[mid][1] != want}
    assert not wrong, list(wrong.items())[:5]

    # none reached the listener or the inbox; everything is still running
    printed = worker.message_ids()
    assert not (set(printed) & set(expected))
    assert not (set(b.inbox("worker")) & set(expected))
    assert worker.alive() and b.relay is not None and b.relay.poll() is None
    assert b.broker_pid() is not None
    # each refusal logged once, with its reason: nothing was retried
    log = b.relay_log()
    logged = re.findall(r"inbound row (\S+) from \S+ refused", log)
    assert sorted(logged) == sorted(expected), (len(logged), len(expected))
    # the relay carries on: later mail still flows both ways
    after = planner.send("worker@B", "after")
    assert after.outcome.value == "delivered"
    assert b_other.send("planner@A", "back").outcome.value == "delivered"


# Flags the receiving side sets; a sender that stores them sets none (relay/screening.py).
FORGED_FLAGS = ["possible_repeat", "resumed", "late", "sender_gone", "acknowledged"]


def test_a_senders_flags_never_reach_the_agent(cluster: Cluster, rogue: Rogue) -> None:
    """A writer of the store (a SQLite writer, or PostgreSQL's shared role) stores a message
    with the receiving side's flags: the agent's listener (`listen --json`) shows none."""
    a, b = cluster.up("A", "B")
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    target = b.session_id("worker")
    mid = new_id()
    flagged = message(new_id(), "R", mid=mid, flags=FORGED_FLAGS)
    rogue.insert([(mid, flagged)], sender_host="R", recipient_host="B", recipient_session=target)
    got = worker.next_message(30)
    assert got["id"] == mid and not got.get("flags"), got


def test_forged_reply_cannot_answer_another_sessions_ask(cluster: Cluster, rogue: Rogue) -> None:
    a, b = cluster.up("A", "B")
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    planner = a.client("planner")
    results: list[Any] = []

    def ask() -> None:
        results.append(planner.ask("worker@B", "which port?", timeout=60))

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    asked = worker.next_message()
    assert asked["expects_reply"] is True

    # a rogue host answers with its own session, and one claiming to be the worker
    own, claimed = new_id(), new_id()
    rogue.insert(
        [
            (own, message(new_id(), "R", mid=own, reply_to=asked["id"], message="forged: 1")),
            (
                claimed,
                message(
                    b.session_id("worker"), "R", mid=claimed, reply_to=asked["id"], message="2"
                ),
            ),
        ],
        sender_host="R",
        recipient_host="A",
        recipient_session=a.session_id("planner"),
    )

    def refused() -> bool:
        return {s for s, _ in rogue.states([own, claimed]).values()} == {"refused"}

    wait_for(refused, 30, "both forged replies to be refused")
    assert rogue.states([own, claimed]) == {
        own: ("refused", "reply_not_authorised"),
        claimed: ("refused", "forged_sender"),
    }
    assert thread.is_alive(), "a forged reply answered the ask"

    # the real answer still gets through
    real = b.cli_json("reply", "--as", "worker", "--json", "port 8080")
    assert real["outcome"] == "delivered", real
    thread.join(30)
    assert results and results[0].reply is not None
    assert results[0].reply.text == "port 8080"
