"""The overseer page lists every host's path reservations (docs/agents.md#path-reservations),
their text inert, in a real Chromium."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.coord.test_reservation_flood import P, _flood
from tests.relay.conftest import Cluster
from tests.web.conftest import WebServer, open_page, start_web
from tests.web.test_overseer import request

HOSTILE = '<img src=x onerror="window.__pwned=1"> splitting'


def test_the_page_lists_every_hosts_reservations(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    a, b = sqlite_cluster.up("A", "B")
    a.cli_json("reserve", "--as", "alice", "--project", "app", "--reason", HOSTILE, "src/**")
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    page = open_page(browser, web)
    item = page.wait_for_selector('#reservations li[data-holder="alice@A"]')
    assert item.inner_text().startswith("app: src/** exclusive by alice@A, ")
    assert item.query_selector(".text").inner_text() == f": {HOSTILE}"
    assert item.query_selector("img") is None and page.evaluate("window.__pwned") is None
    # one taken later shows without a reload
    b.cli_json("reserve", "--as", "bob", "--project", "app", "--shared", "docs/")
    page.wait_for_selector('#reservations li[data-holder="bob@B"]')


def test_the_page_says_when_the_store_held_more_than_one_answer(
    sqlite_cluster: Cluster, web_servers: list[WebServer]
) -> None:
    """A writer of the store planted a flood of A's reservations: B's page gets the oldest that
    fit one frame and `more` (its list then says so), and keeps its link to the relay."""
    small = {"max_frame_bytes": 512 * 1024.0}
    a, b = sqlite_cluster.up("A", "B", A=small, B=small)
    a.cli_json("reserve", "--as", "alice", "--project", P, "docs/**")
    store = Path(sqlite_cluster.store_url.removeprefix("sqlite:///"))
    _flood(store, "A", a.session_id("alice"), 1500)
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    auth = {"Authorization": f"Bearer {web.token}"}
    status, body = request(f"{web.base}/api/reservations", headers=auth)
    assert status == 200 and body["more"] is True, (status, str(body)[:300])
    assert 0 < len(body["reservations"]) < 1000
    assert "alice@A" in {r["holder"] for r in body["reservations"]}
    assert request(f"{web.base}/api/roster", headers=auth)[0] == 200  # the link held
