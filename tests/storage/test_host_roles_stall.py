"""A compromised host tries to stall another host's roster as its own role (PostgreSQL,
per-host roles as docs/operations.md sets them up): it inserts a roster row claiming a session
id the other host is about to publish (a durable id anyone can derive) and leaves its
transaction open. The other host's publish once waited on that row, with its own host row
locked (its heartbeat waiting behind), until the statement timeout, and published nothing.
Now the contested row is left out after a short wait, every other session goes in, and the
publish says so (the relay publishes again at its next beat)."""

from __future__ import annotations

import pytest

from crossintercom.errors import StoreError, StoreUnavailable
from crossintercom.models import SessionInfo, durable_session_id
from crossintercom.storage.blocking import run
from tests.storage.test_host_roles_attack import Host, hosts  # noqa: F401  (a fixture)

pytestmark = pytest.mark.pg


def test_an_open_claim_of_one_session_holds_up_no_other(
    hosts: dict[str, Host],  # noqa: F811
) -> None:
    a, b = hosts["A"], hosts["B"]
    reviewer = durable_session_id(b.host, "reviewer")
    sessions = [
        SessionInfo(id=reviewer, host=b.host, name="reviewer", durable=True),
        SessionInfo(id="eph-b2", host=b.host),
    ]
    with a.connect() as conn, conn.transaction(force_rollback=True):
        conn.execute(
            "INSERT INTO public.roster (host_id, session_id, purpose, groups, durable, online) "
            "VALUES (public.crossintercom_host(), %s, 'agent', '[]', false, true)",
            (reviewer,),
        )
        with pytest.raises(StoreError, match=r"1 session id.* left out") as left_out:
            run(b.store.publish_sessions(b.host, b.gen, sessions))
        assert not isinstance(left_out.value, StoreUnavailable)  # the relay publishes again
        published = {s.id for s in run(b.store.roster()) if s.host == b.host}
        assert published == {"eph-b2"}
        assert run(b.store.heartbeat(b.host, b.gen))  # its host row is not held either
    # the claim never landed: B's next publish takes the id
    assert run(b.store.publish_sessions(b.host, b.gen, sessions))
    assert {s.id for s in run(b.store.roster()) if s.host == b.host} == {reviewer, "eph-b2"}
