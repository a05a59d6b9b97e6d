"""Walking the feed's history (docs/web.md, "History"): the live tab stays bounded under a
burst, "older" pages back through everything from a server-side cursor without repeating or
skipping a message, and filters (session, host, state, kind, thread) narrow the feed, in the
browser and in the API; with the archive off on two hosts and with it on on five.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.relay.conftest import Cluster, wait_for
from tests.web.conftest import WebServer, hosts_for, start_web, wait_feed
from tests.web.test_overseer import request

LIVE_KEEP = 300  # static/feed.js


def feed_page(web: WebServer, query: str) -> dict[str, Any]:
    status, body = request(
        f"{web.base}/api/feed?{query}", headers={"Authorization": f"Bearer {web.token}"}
    )
    assert status == 200, body
    page: dict[str, Any] = body
    return page


def walk(web: WebServer, query: str, limit: int = 70) -> list[str]:
    """Every message id the API pages through, newest first."""
    ids: list[str] = []
    before = ""
    while True:
        page = feed_page(web, f"{query}&limit={limit}&before={before}")
        ids += [m["id"] for m in page["messages"]]
        if not page["before"]:
            return ids
        before = page["before"]


@pytest.mark.parametrize(("n", "archive"), [(2, False), (5, True)])
def test_a_burst_stays_bounded_and_older_pages_walk_back_through_it(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer], n: int, archive: bool
) -> None:
    hosts = hosts_for(sqlite_cluster, n, archive)
    a, b = hosts[0], hosts[1]
    a.listen("alice")
    b.listen("bob")
    b.wait_sees("alice", "A")
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    page = browser.new_page()
    page.goto(web.url)
    page.wait_for_selector("#live.on")

    # Two senders: one alone would meet the per-sender rate limit (300 in 60 s).
    carol, erin = b.client("carol"), b.client("erin")
    half = (LIVE_KEEP + 40) // 2
    mine = [carol.send("alice@A", f"burst {k}").id for k in range(half)]
    burst = mine + [erin.send("alice@A", f"burst {k}").id for k in range(half)]
    other = b.client("dave").send("bob", "not carol's").id
    page.wait_for_selector(f'#feed li[data-id="{other}"]', timeout=60_000)

    def rows() -> int:
        n: int = page.locator("#feed > li").count()
        return n

    wait_for(lambda: rows() == LIVE_KEEP, 30, "the live tab to be bounded")

    # Older pages bring back everything, each message once.
    def older_page() -> None:
        before = rows()
        page.click("#older")
        wait_for(lambda: rows() > before or not page.is_visible("#older"), 30, "an older page")

    while page.is_visible("#older"):
        older_page()
    ids = page.eval_on_selector_all("#feed > li", "els => els.map(e => e.dataset.id)")
    assert len(ids) == len(set(ids))
    assert set(burst) <= set(ids)
    keys = page.eval_on_selector_all("#feed > li", "els => els.map(e => e.dataset.key)")
    assert keys == sorted(keys, reverse=True)

    # The API pages with a cursor: no repeats, nothing skipped, newest first.
    walked = walk(web, "session=carol")
    # (Messages sent in the same millisecond are ordered by id, not by when they were sent.)
    assert len(walked) == len(set(walked)) and set(walked) == set(mine)
    assert other in walk(web, "session=bob")
    assert other not in walk(web, "session=carol")
    assert set(burst) <= set(walk(web, "host=A"))
    thread = feed_page(web, f"thread={burst[5]}")["messages"]
    assert [m["id"] for m in thread] == [burst[5]]

    # Filters in the page: one session; then a kind; then cleared.
    page.fill('#filter-form [name="session"]', "dave")
    page.click('#filter-form button[type="submit"]')
    wait_feed(page, [other], "the feed filtered to dave")
    refused = b.cli_json("send", "--as", "carol", "--to", "nobody", "x", expect_rc=3)["error"]
    page.fill('#filter-form [name="session"]', "")
    page.select_option('#filter-form [name="kind"]', "refusal")
    page.click('#filter-form button[type="submit"]')
    wait_feed(page, [refused["id"]], "the feed filtered to refusals")
    state = feed_page(web, "state=refused")["messages"]
    assert [m["id"] for m in state] == [refused["id"]]
    page.click('#filter-form button[type="reset"]')
    page.wait_for_selector(f'#feed li[data-id="{burst[-1]}"]')
    page.close()


def test_a_filters_late_answer_does_not_replace_the_resets(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    """Two feed loads answering out of order (a filter held back by the test, then a reset):
    the reset's answer stays on screen when the filter's arrives after it."""
    (b,) = hosts_for(sqlite_cluster, 1, False)
    b.listen("bob")
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    sent = b.client("carol").send("bob", "plain mail").id
    refused = b.cli_json("send", "--as", "carol", "--to", "nobody", "x", expect_rc=3)["error"]
    page = browser.new_page()
    page.goto(web.url)
    page.wait_for_selector(f'#feed li[data-id="{sent}"]')
    # The stream open and its catch-up answered: a catch-up reads the filter form too, and one
    # sent while the filter is chosen would be held with it.
    page.wait_for_selector("#live.on")
    page.wait_for_selector('#feed[aria-busy="false"]')

    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)

    def refusals(url: str) -> bool:
        return "/api/feed" in url and "kind=refusal" in url

    page.route(refusals, hold)
    page.select_option('#filter-form [name="kind"]', "refusal")
    page.click('#filter-form button[type="submit"]')
    wait_for(lambda: page.evaluate("1") and held, 30, "the filter's request")
    with page.expect_response(lambda r: "/api/feed" in r.url and "kind=" not in r.url):
        page.click('#filter-form button[type="reset"]')
    assert page.get_attribute("#feed", "aria-busy") == "true"  # the filter's load is still open
    with page.expect_response(lambda r: "kind=refusal" in r.url):
        for route in held:  # should the stream have reopened meanwhile, its catch-up too
            route.continue_()
    page.wait_for_selector('#feed[aria-busy="false"]')
    ids = page.eval_on_selector_all("#feed > li", "els => els.map(e => e.dataset.id)")
    assert sent in ids and refused["id"] in ids


def test_mail_that_arrives_before_the_live_stream_opens_is_shown(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    """The page's live stream held back by the test while a message arrives: the server pushes
    it to no stream, and the page shows it once its stream opens."""
    (b,) = hosts_for(sqlite_cluster, 1, False)
    b.listen("bob")
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    page = browser.new_page()
    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)

    page.route(lambda url: url.endswith("/events"), hold)
    page.goto(web.url)
    wait_for(lambda: page.evaluate("1") and held, 30, "the live stream's request")
    sent = b.client("carol").send("bob", "while the stream was not open").id
    wait_for(lambda: sent in [m["id"] for m in feed_page(web, "")["messages"]], 30, "the server")
    assert not page.is_visible(f'#feed li[data-id="{sent}"]')
    held[0].continue_()
    page.wait_for_selector("#live.on")
    page.wait_for_selector(f'#feed li[data-id="{sent}"]')
