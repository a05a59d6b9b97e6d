"""Relays that connect as their hosts' own PostgreSQL roles (row-level security, migration
0004) run the whole protocol: roster, send, ask and reply, receipts, across two hosts."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from crossintercom.config import ENV_STORE
from crossintercom.models import durable_session_id, new_id
from crossintercom.storage.roles import grant_host
from crossintercom.storage.wakeup import ROSTER, ROSTER_CHANNEL
from crossintercom.tools.chaos.rogue import inject_rows, rogue_message
from tests.hostroles import drop_host_roles
from tests.pgharness import PgServer
from tests.relay.conftest import Cluster, wait_for

pytestmark = pytest.mark.pg
PASSWORD = "h0st-r0le"


@pytest.fixture
def granted(pg_server: PgServer, pg_url: str) -> Iterator[dict[str, str]]:
    """Host id -> a store URL connecting as that host's own role."""
    suffix = uuid.uuid4().hex[:6]
    urls: dict[str, str] = {}
    roles = []
    for name in ("A", "B"):
        host = f"{name}{suffix}"
        role, _ = grant_host(pg_url, host, PASSWORD)
        roles.append(role)
        url = make_url(pg_url).set(username=role, password=PASSWORD)
        urls[host] = url.render_as_string(hide_password=False)
    yield urls
    drop_host_roles(pg_server, roles, pg_url)


def test_relays_as_host_roles(pg_url: str, granted: dict[str, str]) -> None:
    host_a, host_b = sorted(granted)
    with Cluster(pg_url) as cluster:
        a = cluster.host(host_a, relay=False)
        b = cluster.host(host_b, relay=False)
        for h in (a, b):
            h.env[ENV_STORE] = granted[h.host_id]
            h.start_relay()
        worker = b.listen("worker")
        a.wait_sees("worker", host_b)
        planner = a.client("planner")
        sent = planner.send(f"worker@{host_b}", "hello under row-level security")
        assert sent.outcome.value == "delivered", sent
        assert worker.next_message(30)["id"] == sent.id

        answers: list[Any] = []
        t = threading.Thread(
            target=lambda: answers.append(planner.ask(f"worker@{host_b}", "ready?", timeout=60)),
            daemon=True,
        )
        t.start()
        asked = worker.next_message()
        assert asked["expects_reply"] is True
        reply = b.cli_json("reply", "--as", "worker", "--json", "yes")
        assert reply["outcome"] == "delivered", reply
        t.join(30)
        assert answers and answers[0].reply is not None and answers[0].reply.text == "yes"
        assert "row-level security" not in a.relay_log() + b.relay_log()

        # B's role plants a roster row whose id is one A derives for a name it has not
        # published yet (a published one the store refuses): A's relay drops it (logged), so
        # mail by that id never goes to B.
        stolen = durable_session_id(host_a, "later")
        with psycopg.connect(granted[host_b].replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO roster (host_id, session_id, name, purpose, groups, durable, online)"
                " VALUES (%s, %s, 'decoy', 'agent', '[]', true, true)",
                (host_b, stolen),
            )
            conn.execute("UPDATE hosts SET roster_rev = roster_rev + 1 WHERE host_id = %s",
                         (host_b,))  # fmt: skip
            conn.execute("SELECT pg_notify(%s, %s)", (ROSTER_CHANNEL, ROSTER))
        wait_for(lambda: "roster rows dropped" in a.relay_log(), 30, "A to drop the claim")
        assert stolen not in {s["id"] for s in a.cli_json("list", "--json")}


def test_a_host_roles_flags_never_reach_the_agent(pg_url: str, granted: dict[str, str]) -> None:
    """B's role stores a message for A's session carrying the receiving side's flags, as its
    own (the policies let it): A's agent sees none of them (relay/screening.py)."""
    host_a, host_b = sorted(granted)
    with Cluster(pg_url) as cluster:
        a = cluster.host(host_a, relay=False)
        a.env[ENV_STORE] = granted[host_a]
        a.start_relay()
        worker = a.listen("worker")
        mid = new_id()
        flags = ["possible_repeat", "resumed", "late", "sender_gone", "acknowledged"]
        payload = rogue_message(new_id(), host_b, mid=mid, flags=flags)
        inject_rows(
            granted[host_b],
            [(mid, payload)],
            sender_host=host_b,
            recipient_host=host_a,
            recipient_session=a.session_id("worker"),
        )
        got = worker.next_message(30)
        assert got["id"] == mid and not got.get("flags"), got
