"""A backlog larger than the broker's "not reading" bound: a durable session away while mail
under the size limit piles up to tens of megabytes. The broker once handed it all over in one
burst and dropped the returning client as a peer that does not read, before it could read
anything, at every reconnect: that session could never come back. Now the connection makes
room for a page of it, and pages follow as the client acknowledges them (docs/delivery.md)."""

from __future__ import annotations

from pathlib import Path

from crossintercom.client import Client, Identity
from crossintercom.local_broker.delivery.local import DRAIN_PAGE_BYTES
from crossintercom.local_broker.sessions.conn import WRITE_BACKLOG_FRAMES
from tests.conftest import Listener, make_env, settings_for, start_broker

BODY = 900_000  # under the default 1 MiB message limit


def test_a_backlog_of_more_than_the_bound_reaches_its_returning_session(
    runtime_home: Path,
) -> None:
    env = make_env(runtime_home)
    start_broker(env)
    cfg = settings_for(env)
    bound = WRITE_BACKLOG_FRAMES * 8 * 1024 * 1024
    count = (max(bound, DRAIN_PAGE_BYTES) + 4 * 1024 * 1024) // BODY  # over both: two pages
    with Client(cfg, Identity.named(cfg, "carol")):
        pass  # known, and away from now on
    with Client(cfg, Identity.named(cfg, "planner")) as planner:
        sent = [planner.send("carol", f"{i:04d} " + "x" * BODY) for i in range(count)]
    assert {r.outcome.value for r in sent} == {"queued"}
    with Listener(env, "carol") as carol:
        got = [m["message"][:4] for m in carol.messages(count, timeout=120)]
    assert got == [f"{i:04d}" for i in range(count)]  # all of it, in order
    log = (runtime_home / "broker.log").read_text()
    assert "not reading" not in log
