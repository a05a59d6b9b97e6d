"""The overseer page lists every host's path reservations (docs/agents.md#path-reservations),
their text inert, in a real Chromium."""

from __future__ import annotations

from typing import Any

from tests.relay.conftest import Cluster
from tests.web.conftest import WebServer, open_page, start_web

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
