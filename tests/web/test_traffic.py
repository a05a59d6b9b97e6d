"""The page's feed is this host's whole traffic (docs/web.md, "Where the feed comes from"):
with the archive off, on three simulated hosts, the page on B shows what B's sessions sent to
other hosts and received from them, a refused send with its code, the overseer's own compose,
a group message's receipts merged per recipient, a queued message turning ``delivered`` once
its session is back, all in time order and by name, never a session id; hostile text in a
subject stays text. With the archive on, on five hosts, the page shows traffic between two
other hosts with the receipts only their hosts know (``shown``, a queued message delivered, on
another host and on one host), an ask between them with its asker's timeout and once it passed,
and search finds mail received before the archive was turned on.
"""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import background_cli
from tests.relay.conftest import Cluster, wait_for
from tests.web.conftest import WebServer, hosts_for, open_page, start_web

HOSTILE = '<img src=x onerror="window.__pwned = 1"><script>window.__pwned = 2</script>'


def item(page: Any, mid: str) -> Any:
    return page.wait_for_selector(f'#feed li[data-id="{mid}"]')


def receipts(page: Any, mid: str) -> list[str]:
    found: list[str] = page.eval_on_selector_all(
        f'#feed li[data-id="{mid}"] .receipt', "els => els.map(e => e.textContent)"
    )
    return found


def has_receipt_of(page: Any, mid: str, who: str) -> bool:
    return any(r.startswith(f"{who}: ") for r in receipts(page, mid))


def wait_receipt(page: Any, mid: str, text: str) -> None:
    """Until ``mid`` shows the receipt ``text`` (with or without a code after it)."""

    def shown() -> bool:
        return any(r == text or r.startswith(f"{text} (") for r in receipts(page, mid))

    wait_for(shown, 30, f"{text!r} on {mid}")


def test_without_the_archive_the_page_shows_this_hosts_whole_traffic(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    a, b, c = sqlite_cluster.up("A", "B", "C")
    a.listen("alice")
    bob = b.listen("bob")
    c.listen("carol")
    b.listen("dora").stop()  # durable, offline: her mail is queued
    for name, host in (("alice", "A"), ("carol", "C")):
        b.wait_sees(name, host)
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    page = open_page(browser, web)

    # Outbound from B to A (the old page never showed it), with a hostile subject.
    out = b.cli_json("send", "--as", "bob", "--to", "alice@A", "--subject", HOSTILE, "to A")
    row = item(page, out["id"])
    assert row.query_selector(".subject").inner_text() == HOSTILE
    assert row.query_selector(".from").inner_text() == "bob@B"
    wait_for(lambda: any(r.startswith("alice@A: ") for r in receipts(page, out["id"])), 30, "A")
    # Inbound from A.
    back = a.cli_json("send", "--as", "alice", "--to", "bob@B", "back to B")
    bob.next_message()
    wait_receipt(page, back["id"], "bob@B: shown")
    # A refusal, with its code.
    refused = b.cli_json("send", "--as", "bob", "--to", "nobody", "lost", expect_rc=3)["error"]
    row = item(page, refused["id"])
    assert "refusal" in row.get_attribute("class")
    assert receipts(page, refused["id"]) == [f"refused ({refused['code']})"]
    # Queued for dora on this host; a group message with a receipt per recipient.
    queued = b.cli_json("send", "--as", "bob", "--to", "dora", "wait for me")
    assert queued["outcome"] == "queued"
    wait_receipt(page, queued["id"], "dora@B: queued")
    group = b.cli_json("send", "--as", "bob", "--to", "group:default", "everyone")
    everyone = ("alice@A", "carol@C", "dora@B")
    wait_for(
        lambda: all(has_receipt_of(page, group["id"], w) for w in everyone), 30, "group receipts"
    )
    # The overseer's own compose to another host.
    page.fill('#compose-form [name="to"]', "carol@C")
    page.fill('#compose-form [name="message"]', "from the page")
    page.click('#compose-form button[type="submit"]')
    page.wait_for_function("document.getElementById('compose-result').textContent.includes('id')")
    composed = json.loads(page.inner_text("#compose-result"))
    wait_for(
        lambda: any(r.startswith("carol@C: ") for r in receipts(page, composed["id"])), 30, "C"
    )
    item(page, composed["id"])

    # dora comes back: the queued message turns delivered (or on to shown) without a reload.
    b.listen("dora")
    wait_for(
        lambda: any(
            r in receipts(page, queued["id"]) for r in ("dora@B: delivered", "dora@B: shown")
        ),
        30,
        "the queued message delivered",
    )
    # Time order, newest first; names, never session ids; nothing hostile ran.
    keys = page.eval_on_selector_all("#feed li", "els => els.map(e => e.dataset.key)")
    assert keys == sorted(keys, reverse=True)
    text = page.inner_text("#feed")
    for sim, name in ((a, "alice"), (b, "bob"), (c, "carol"), (b, "dora")):
        assert sim.session_id(name) not in text, name
    assert page.evaluate("window.__pwned") is None
    page.close()


def test_with_the_archive_the_page_shows_every_hosts_traffic(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    a, b, _c, d, e = hosts_for(sqlite_cluster, 5, archive=False)  # turned on below
    bob = b.listen("bob")
    # Received before the archive was on: found by search all the same.
    early = b.cli_json("send", "--as", "zed", "--to", "bob", "a quokka before the archive")
    bob.next_message()
    assert a.cli_json("archive", "on")["enabled"] is True
    d.listen("dan")
    d.listen("dora").stop()
    eve = e.listen("eve")
    e.listen("erin").stop()
    d.wait_sees("eve", "E")
    web = start_web(b, "--as", "boss")
    web_servers.append(web)
    page = open_page(browser, web)
    page.wait_for_selector("#archive-state.on")

    # Between two other hosts: D to E, on the page on B; shown to eve on E, which only E knows.
    far = d.cli_json("send", "--as", "dan", "--to", "eve@E", "from D to E")
    item(page, far["id"])
    assert eve.next_message()["id"] == far["id"]
    wait_receipt(page, far["id"], "eve@E: shown")
    # Queued for a session on E, then delivered when she is back: the archive learns it.
    d.wait_sees("erin", "E", online=False)
    later = d.cli_json("send", "--as", "dan", "--to", "erin@E", "when you are back")
    assert later["outcome"] == "queued", later
    item(page, later["id"])
    wait_receipt(page, later["id"], "erin@E: queued")
    e.listen("erin")
    wait_arrived(page, later["id"], "erin@E")
    # Queued on D for a session on D (it never touches the store), then delivered.
    local = d.cli_json("send", "--as", "dan", "--to", "dora", "same host, later")
    assert local["outcome"] == "queued", local
    wait_receipt(page, local["id"], "dora@D: queued")
    d.listen("dora")
    wait_arrived(page, local["id"], "dora@D")
    # On this host, shown arrives.
    here = a.cli_json("send", "--as", "ann", "--to", "bob@B", "to bob")
    bob.next_message()
    wait_receipt(page, here["id"], "bob@B: shown")

    # An ask between two other hosts shows its asker's timeout, and passes it.
    for wait, late in (("600", False), ("2", True)):
        with background_cli(
            d.env, "ask", "--as", "dan", "--to", "eve@E", "--timeout", wait, "--json", "far?"
        ):
            ask = eve.next_message()
            sel = f'#attention-list li[data-kind="ask"][data-id="{ask["id"]}"] .timeout'
            shown = page.wait_for_selector(sel + (".late" if late else ""), timeout=30_000)
            assert "timeout" in shown.inner_text()
            assert ("passed" in shown.inner_text()) is late

    page.fill('#search-form [name="q"]', "quokka")
    page.click('#search-form button[type="submit"]')
    page.wait_for_selector(f'#results li[data-id="{early["id"]}"] mark')
    page.close()


def wait_arrived(page: Any, mid: str, who: str) -> None:
    """Until ``who`` has it: ``delivered``, or already ``shown`` (a listener shows what it
    prints)."""
    wanted = (f"{who}: delivered", f"{who}: shown")
    wait_for(lambda: any(r in wanted for r in receipts(page, mid)), 30, f"{mid} to {who}")
