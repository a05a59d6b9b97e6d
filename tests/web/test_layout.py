"""The page's layout for a day's use (docs/web.md, "Layout"): at desktop and at phone width
(390 px), on two hosts without the archive and five with it, nothing overflows sideways
(screenshots kept in the test's directory), a 10 KB message is collapsed until expanded, the
tools stay in reach while the feed scrolls in its own pane, every control is labelled and a
skip link comes first; threads open in place and follow live mail; the reply form is filled
from the message it answers; the flow picture keeps 20 hosts and their counts apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import background_cli, wait_for
from tests.relay.conftest import Cluster
from tests.web.conftest import WebServer, hosts_for, open_page, start_web

OVERFLOW = "document.scrollingElement.scrollWidth > document.scrollingElement.clientWidth"
# 20 hosts in a ring, each sending to the next (more each time) and back, drawn by the page's
# own code.
RING = """async () => {
  const flow = await import('/static/flow.js');
  const hosts = Array.from({length: 20}, (_, i) => ({host: `host-${String(i).padStart(2, '0')}`}));
  const feed = new Map();
  let k = 0;
  const add = (a, b) => feed.set(`m${k++}`, {from: {host: a}, recipients: [{host: b}]});
  hosts.forEach((h, i) => {
    const next = hosts[(i + 1) % 20].host;
    for (let j = 0; j <= i; j++) add(h.host, next);
    add(next, h.host);
  });
  flow.draw({hosts, sessions: []}, feed);
}"""
# How many pairs of node circles, host names and count labels overlap.
OVERLAPS = """() => {
  const boxes = (sel) => [...document.querySelectorAll(sel)].map(e => e.getBBox());
  const hit = (p, q) => p.x < q.x + q.width && q.x < p.x + p.width
    && p.y < q.y + q.height && q.y < p.y + p.height;
  const count = (list) => {
    let n = 0;
    list.forEach((p, i) => list.slice(i + 1).forEach(q => { if (hit(p, q)) n++; }));
    return n;
  };
  return {
    nodes: document.querySelectorAll('#flow g.node').length,
    labels: document.querySelectorAll('#flow g.count').length,
    listed: document.querySelectorAll('#flow-list li').length,
    circles: count(boxes('#flow g.node circle')),
    names: count(boxes('#flow g.node text')),
    counts: count(boxes('#flow g.count rect')),
  };
}"""
UNLABELLED = """() => [...document.querySelectorAll('input, select, textarea')]
  .filter(e => !e.labels.length && !e.getAttribute('aria-label')).map(e => e.name)"""


@pytest.mark.parametrize(("n", "archive"), [(2, False), (5, True)])
def test_no_sideways_overflow_at_desktop_and_phone_width(
    sqlite_cluster: Cluster,
    browser: Any,
    web_servers: list[WebServer],
    tmp_path: Path,
    n: int,
    archive: bool,
) -> None:
    hosts = hosts_for(sqlite_cluster, n, archive)
    a, b = hosts[0], hosts[1]
    a.listen("alice")
    b.listen("bob")
    b.wait_sees("alice", "A")
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    # One unbreakable 10 KB word and a long subject: the worst case for wrapping.
    long = a.cli_json(
        "send", "--as", "alice", "--to", "bob@B", "--subject", "s" * 150, "w" * 10_000
    )
    carol = b.client("carol")
    for k in range(40):
        carol.send("alice@A", f"message {k} " + "words " * 30)
    for width, height in ((1280, 800), (390, 844)):
        page = open_page(browser, web, viewport={"width": width, "height": height})
        item = page.locator(f'#feed li[data-id="{long["id"]}"]')
        item.wait_for()
        # The first Tab reaches the skip link; it takes the keyboard to the messages.
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.className") == "skip"
        page.keyboard.press("Enter")
        page.wait_for_function("document.activeElement.id === 'feed-pane'")
        page.screenshot(path=str(tmp_path / f"overseer-{n}-hosts-{width}px.png"), full_page=True)
        assert not page.evaluate(OVERFLOW), f"sideways overflow at {width} px"
        text = item.locator(":scope > .text")
        assert "collapsed" in (text.get_attribute("class") or "")
        assert text.bounding_box()["height"] < 300
        item.locator("button.expand").click()
        assert "collapsed" not in (text.get_attribute("class") or "")
        assert item.locator("button.expand").get_attribute("aria-expanded") == "true"
        if width > 800:
            # Its receipts move on (bob acknowledges it): redrawn, it stays shown in full.
            b.cli_json("ack", "--as", "bob", long["id"])
            item.locator(".receipt.acknowledged").wait_for(timeout=30_000)
            assert "collapsed" not in (text.get_attribute("class") or "")
        assert not page.evaluate(OVERFLOW), f"sideways overflow at {width} px, expanded"
        if width > 800:
            # The feed scrolls in its own pane: compose and search are on screen at once.
            for tool in ("#compose-form", "#search-form"):
                box = page.query_selector(tool).bounding_box()
                assert box is not None and box["y"] < height, tool
            assert page.evaluate("document.scrollingElement.scrollHeight") <= height + 2
        assert page.evaluate(UNLABELLED) == []
        page.close()


HOSTILE_JOIN = '<img src=x onerror="window.__pwned = 1">joins'


def test_threads_open_in_place_and_the_reply_form_follows_the_message(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    a, b = sqlite_cluster.up("A", "B")
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    a.wait_sees("boss", "B")
    page = open_page(browser, web)
    asks = [
        ("alice", "first", "release today?"),
        ("ann", "second", "which branch?"),
    ]
    with (
        background_cli(a.env, "ask", "--as", asks[0][0], "--to", "boss@B", "--subject",
                       asks[0][1], "--timeout", "120", "--json", asks[0][2]) as first,
        background_cli(a.env, "ask", "--as", asks[1][0], "--to", "boss@B", "--subject",
                       asks[1][1], "--timeout", "120", "--json", asks[1][2]) as second,
    ):  # fmt: skip
        page.wait_for_function("document.querySelectorAll('#feed li.ask').length === 2")
        pairs = page.eval_on_selector_all(
            "#feed li.ask",
            "els => els.map(e => [e.querySelector('.subject').textContent, e.dataset.id])",
        )
        rows = {subject: f'#feed li[data-id="{mid}"]' for subject, mid in pairs}
        form = '#compose-form [name="{}"]'
        for name, subject, _ in asks:
            page.click(f"{rows[subject]} button.answer")
            assert page.input_value(form.format("mode")) == "reply"
            assert page.input_value(form.format("to")) == f"{name}@A"
            assert page.input_value(form.format("subject")) == subject
        # The second ask's reply, with the second ask's fields only.
        page.fill(form.format("message"), "main")
        page.click('#compose-form button[type="submit"]')
        out, err = second.communicate(timeout=60)
        assert second.returncode == 0, (out, err)
        # The next one starts empty, once the page has the send's answer (the asker may have
        # the reply before the page has read its own answer).
        page.wait_for_function(
            "document.querySelector('#compose-form [name=\"subject\"]').value === ''"
        )
        # A thread opens under the message it was opened from.
        row = rows["first"]
        page.click(f"{row} a.thread")
        page.wait_for_selector("#thread-section:not([hidden]) #thread li")
        assert page.eval_on_selector(row, "e => e.nextElementSibling.id") == "thread-section"
        # The open thread follows live mail: a message joining it shows there without a
        # reload; one of another thread (already in the feed) does not.
        thread = page.get_attribute(f"{row} a.thread", "data-thread")
        other = a.cli_json("send", "--as", "zed", "--to", "boss@B", "elsewhere")
        page.wait_for_selector(f'#feed li[data-id="{other["id"]}"]')
        joined = a.cli_json(
            "send", "--as", "zed", "--to", "boss@B", "--thread", str(thread), HOSTILE_JOIN
        )
        page.wait_for_selector(f'#thread li[data-id="{joined["id"]}"]')
        assert page.query_selector(f'#thread li[data-id="{other["id"]}"]') is None
        ids = page.eval_on_selector_all("#thread > li", "els => els.map(e => e.dataset.id)")
        assert ids[-1] == joined["id"], ids  # oldest first, the newcomer last
        assert page.evaluate("window.__pwned") is None

        # A newer copy of the row replaces it while its thread is being read (live mail does):
        # the thread opens under the row that is there now.
        page.click("#thread-close")
        held: list[Any] = []

        def hold(route: Any) -> None:
            held.append(route)

        page.route("**/api/thread/**", hold)
        page.click(f"{rows['second']} a.thread")
        wait_for(lambda: page.evaluate("1") and held, 30, "the thread's request")
        page.eval_on_selector(rows["second"], "e => e.replaceWith(e.cloneNode(true))")
        for route in held:
            route.continue_()
        page.wait_for_selector("#thread-section:not([hidden]) #thread li")
        assert (
            page.eval_on_selector(rows["second"], "e => e.nextElementSibling.id")
            == "thread-section"
        )
        first.kill()


def test_the_flow_picture_keeps_twenty_hosts_apart(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    [b] = sqlite_cluster.up("B")
    web = start_web(b)
    web_servers.append(web)
    page = open_page(browser, web)
    # The page's own drawing code, given 20 hosts in a ring with counts both ways.
    page.evaluate(RING)
    overlaps = page.evaluate(OVERLAPS)
    assert overlaps == {
        "nodes": 20,
        "labels": 40,
        "listed": 40,
        "circles": 0,
        "names": 0,
        "counts": 0,
    }
    page.close()
