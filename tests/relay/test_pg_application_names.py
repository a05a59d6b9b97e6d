"""Every PostgreSQL connection a relay opens names its host in ``application_name``
(``crossintercom relay HOST``; the archive and the LISTEN run on the relay's own connection), so
``pg_stat_activity`` (the bench's connections per host, `status`'s stuck-transaction report)
tells whose each backend is. A name the user put in the store URL wins; an odd or long host id
still gives a printable name of at most 63 bytes."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.engine import make_url

from crossintercom.storage import open_store
from crossintercom.storage.blocking import run
from crossintercom.storage.engine import application_name
from crossintercom.storage.urls import parse_store_url
from tests.relay.conftest import Cluster, wait_for

pytestmark = pytest.mark.pg


def backend_names(url: str) -> list[str]:
    """The application_name of every other backend on the store's database."""
    with psycopg.connect(parse_store_url(url).libpq_conninfo(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return sorted(str(r[0]) for r in rows)


def test_a_relays_backends_carry_its_host_id(pg_url: str) -> None:
    names = {application_name("relay", "host-a")}
    with Cluster(pg_url) as cluster:
        a = cluster.host("host-a")
        a.listen("sink")
        a.client("sender").send("sink@host-a", "hello")
        # The relay's one connection (statements and LISTEN) is open once it is up.
        wait_for(
            lambda: names <= set(backend_names(pg_url)),
            30,
            "the relay's backends to show its name",
        )
        seen = backend_names(pg_url)
        assert seen and set(seen) <= names, seen
    assert "crossintercom relay host-a" in names


def names_of_a_store(url: str, host_id: str) -> list[str]:
    """The backends' names while a store (its archive used too) and its waiter are open for a
    host."""
    store = run(open_store(url, host_id=host_id))
    try:
        run(store.heartbeat(host_id, 1))
        run(store.archive.archive_settings())
        with store.waiter(host_id):
            return backend_names(url)
    finally:
        run(store.aclose())


def test_the_urls_own_name_wins_and_odd_host_ids_are_capped(pg_url: str) -> None:
    host = "h\u00f4te\n" + "x" * 80
    name = application_name("relay", host)
    assert name.startswith("crossintercom relay h\\xf4te\\n")
    assert len(name.encode()) == 63 and name.isprintable()
    assert names_of_a_store(pg_url, host) == [name]

    mine = make_url(pg_url).update_query_dict({"application_name": "mine"})
    assert names_of_a_store(mine.render_as_string(hide_password=False), host) == ["mine"]
