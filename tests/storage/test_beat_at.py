"""When a host's heartbeat last moved, by the database's clock: stamped by the
store on every claim and heartbeat, so an observer that starts after a host died still knows
for how long it has been dead (docs/web.md, "Hosts")."""

from __future__ import annotations

from sqlalchemy import text

from crossintercom.storage import MailboxStore
from crossintercom.storage import engine as db
from crossintercom.storage.blocking import run
from crossintercom.storage.urls import parse_store_url


def age(store: MailboxStore, host: str) -> float | None:
    return {h.host_id: h.beat_age_s for h in run(store.hosts())}[host]


def test_a_hosts_beat_age_comes_from_the_store(store: MailboxStore, store_url: str) -> None:
    gen = run(store.claim_host("hostA"))
    fresh = age(store, "hostA")
    assert fresh is not None and fresh < 3600
    # An hour without a heartbeat (as if its relay died then): an observer reads an hour.
    engine = db.store_engine(parse_store_url(store_url))
    try:
        with engine.begin() as conn:
            an_hour_ago = (
                "now() - interval '1 hour'"
                if engine.dialect.name == "postgresql"
                else "datetime('now', '-1 hour')"
            )
            conn.execute(text(f"UPDATE hosts SET beat_at = {an_hour_ago}"))
    finally:
        engine.dispose()
    dead = age(store, "hostA")
    assert dead is not None and dead >= 3600
    # Its next heartbeat stamps it again.
    assert run(store.heartbeat("hostA", gen))
    back = age(store, "hostA")
    assert back is not None and back < 3600
