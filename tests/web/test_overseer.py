"""The overseer page in a real headless Chromium, on host B of two simulated hosts sharing a
store (docs/web.md): both hosts' sessions, a CLI message from A shown live, compose reaching a
listener, a ``<script>`` message shown as text, threads, receipts, search; and the doors:
no token, a wrong token, a missing CSRF token, a foreign Host or Origin are all refused.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.conftest import background_cli
from tests.relay.conftest import Cluster, Host
from tests.web.conftest import WebServer, start_web

HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"><b>bold</b>'


def request(
    url: str, *, method: str = "GET", headers: dict[str, str] | None = None, body: Any = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def two_hosts_with_archive(cluster: Cluster) -> tuple[Host, Host]:
    a, b = cluster.host("A", relay=False), cluster.host("B", relay=False)
    assert a.cli_json("archive", "on")["enabled"] is True
    a.start_relay()
    b.start_relay()
    return a, b


def test_the_page_shows_both_hosts_live_messages_compose_and_escapes_text(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    a, b = two_hosts_with_archive(sqlite_cluster)
    alice = a.listen("alice")
    bob = b.listen("bob")
    a.wait_sees("bob", "B")
    b.wait_sees("alice", "A")
    web = start_web(b, "--as", "boss")
    web_servers.append(web)

    # The page's Content-Security-Policy would stop injected script too; bypassed here so the
    # escaping alone is what is tested (the header is checked below).
    page = browser.new_page(bypass_csp=True)
    response = page.goto(web.url)
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert "token=" not in page.url  # traded for a cookie, gone from the address bar
    # Sessions of both hosts, and both hosts with their lease.
    page.wait_for_selector('#sessions tr[data-name="alice"][data-host="A"] .online')
    page.wait_for_selector('#sessions tr[data-name="bob"][data-host="B"] .online')
    page.wait_for_selector('#hosts tr[data-host="A"] .lease.held')
    page.wait_for_selector('#hosts tr[data-host="B"] .lease.held')
    page.wait_for_selector("#live.on")
    page.evaluate("window.__sameDocument = true")

    # A message sent from the CLI on host A appears live on the page opened on host B.
    sent = a.cli_json(
        "send", "--as", "alice", "--to", "bob", "--subject", "standup", "hello from A"
    )
    bob.next_message()
    item = page.wait_for_selector(f'#feed li[data-id="{sent["id"]}"]')
    assert item.query_selector(".text").inner_text() == "hello from A"
    assert item.query_selector(".subject").inner_text() == "standup"
    assert item.query_selector(".from").inner_text() == "alice@A"
    # bob's listener showed it: the receipt moves on to ``shown`` (a listener reports it).
    page.wait_for_selector(f'#feed li[data-id="{sent["id"]}"] .receipt.shown')
    assert page.evaluate("window.__sameDocument") is True  # no reload
    # The flow picture has both hosts and an edge from A to B.
    page.wait_for_selector('#flow g.node[data-host="A"]')
    page.wait_for_selector('#flow line[data-edge="A->B"]', state="attached")

    # A hostile message renders as text and runs nothing.
    hostile = a.cli_json("send", "--as", "alice", "--to", "bob", HOSTILE)
    bob.next_message()
    item = page.wait_for_selector(f'#feed li[data-id="{hostile["id"]}"]')
    assert item.query_selector(".text").inner_text() == HOSTILE
    assert item.query_selector(".text script, .text img, .text b") is None
    assert page.evaluate("window.__pwned") is None

    # Compose sends as the named human session; the recipient's listener on A gets it.
    page.fill('#compose-form [name="to"]', "alice@A")
    page.fill('#compose-form [name="subject"]', "from the overseer")
    page.fill('#compose-form [name="message"]', "please pause the deploy")
    page.select_option('#compose-form [name="priority"]', "urgent")
    page.check('#compose-form [name="ack_required"]')
    page.click('#compose-form button[type="submit"]')
    page.wait_for_function(
        "document.getElementById('compose-result').textContent.includes('\"outcome\"')"
    )
    result = json.loads(page.inner_text("#compose-result"))
    assert (result["outcome"], result["exit_code"]) == ("delivered", 0)
    got = alice.next_message()
    assert (got["priority"], got["ack_required"]) == ("urgent", True)
    assert got["id"] == result["id"]
    assert got["message"] == "please pause the deploy"
    assert (got["from"]["name"], got["from"]["host"]) == ("boss", "B")
    assert got["subject"] == "from the overseer"

    # Reply from A joins the thread; the thread view shows both, in order.
    answer = a.cli_json(
        "send", "--as", "alice", "--to", "boss@B", "--thread", result["id"], "paused"
    )
    page.wait_for_selector(f'#feed li[data-id="{answer["id"]}"]')
    page.click(f'#feed li[data-id="{answer["id"]}"] a.thread')
    page.wait_for_selector(f'#thread li[data-id="{answer["id"]}"]')
    ids = page.eval_on_selector_all("#thread li", "els => els.map(e => e.dataset.id)")
    assert ids == [result["id"], answer["id"]]

    # Search: ranked hits with the words highlighted as elements, text still text.
    page.fill('#search-form [name="q"]', "deploy")
    page.click('#search-form button[type="submit"]')
    page.wait_for_selector(f'#results li[data-id="{result["id"]}"] mark')
    assert "archive" in page.inner_text("#search-source")
    assert page.inner_text(f'#results li[data-id="{result["id"]}"] mark').lower() == "deploy"
    page.fill('#search-form [name="q"]', "script pwned")
    page.click('#search-form button[type="submit"]')
    page.wait_for_selector(f'#results li[data-id="{hostile["id"]}"] mark')
    assert page.evaluate("window.__pwned") is None

    # An ask to the human session: pending on the page, answered from compose.
    with background_cli(
        a.env, "ask", "--as", "alice", "--to", "boss@B", "--timeout", "60", "--json", "go on?"
    ) as ask:
        pending = page.locator("#pending li button").first
        pending.wait_for(timeout=30_000)
        pending.click()
        assert page.input_value('#compose-form [name="mode"]') == "reply"
        page.fill('#compose-form [name="message"]', "yes, go on")
        page.click('#compose-form button[type="submit"]')
        out, err = ask.communicate(timeout=60)
    assert ask.returncode == 0, (out, err)
    assert json.loads(out)["reply"]["message"] == "yes, go on"
    page.close()


def test_requests_without_the_token_or_csrf_are_refused(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    [b] = sqlite_cluster.up("B")
    web = start_web(b)
    web_servers.append(web)
    token_file = web.info["token_file"]
    with open(token_file) as f:
        assert f.read().strip() == web.token

    # No token, a wrong one, in the browser and without.
    page = browser.new_page()
    response = page.goto(web.base + "/")
    assert response.status == 401 and "access token" in page.content()
    assert page.goto(web.base + "/?token=wrong").status == 401
    page.close()
    for path in ("/", "/api/roster", "/events", "/api/search?q=x"):
        status, body = request(web.base + path)
        assert status == 401, (path, status, body)
        assert body["error"]["code"] == "bad_token"
    auth = {"Authorization": f"Bearer {web.token}"}
    status, roster = request(web.base + "/api/roster", headers=auth)
    assert status == 200 and roster["me"]["name"] == "overseer"

    # State-changing requests: the token alone is not enough.
    compose = web.base + "/api/compose"
    body = {"mode": "send", "to": "nobody", "message": "x"}
    json_ct = {"Content-Type": "application/json"}
    status, out = request(compose, method="POST", headers={**auth, **json_ct}, body=body)
    assert (status, out["error"]["code"]) == (403, "csrf")
    status, page_html = request(web.base + "/", headers=auth)
    csrf = page_html.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    with_csrf = {**auth, **json_ct, "X-CSRF-Token": csrf}
    evil = {**with_csrf, "Origin": "http://evil.example"}
    status, out = request(compose, method="POST", headers=evil, body=body)
    assert (status, out["error"]["code"]) == (403, "csrf")
    status, out = request(compose, method="POST", headers=with_csrf, body=body)
    assert status == 200 and out["outcome"] == "refused" and out["exit_code"] == 3
    # The refused send is a dead letter of this host, listed on the page.
    status, dead = request(web.base + "/api/dead-letters", headers=auth)
    assert status == 200 and [(d["id"], d["code"]) for d in dead] == [(out["id"], "not_found")]
    b.cli_json("inbound", "--as", "worker", "pest", "refuse")
    status, inbound = request(web.base + "/api/inbound", headers=auth)
    assert status == 200 and inbound["worker"] == {"rules": {"pest": "refuse"}, "held": 0}
    status, out = request(compose, method="POST", headers=with_csrf, body={"mode": "x"})
    assert (status, out["error"]["code"]) == (400, "invalid_argument")
    # One page per human session: a second one for the same name is refused, readably.
    second = b.cli("web", "--listen", "127.0.0.1:0", "--json", timeout=60)
    assert second.returncode != 0
    assert json.loads(second.stdout)["error"]["code"] == "session_in_use", second
    # A page served under another name (DNS rebinding) is refused before the token is read.
    status, out = request(web.base + "/api/roster", headers={**auth, "Host": "evil.example"})
    assert (status, out["error"]["code"]) == (421, "unknown_host")


@pytest.mark.parametrize("listen", ["nonsense", "127.0.0.1:99999"])
def test_a_bad_listen_address_is_a_usage_error(sqlite_cluster: Cluster, listen: str) -> None:
    [b] = sqlite_cluster.up("B")
    out = b.cli("web", "--listen", listen, "--json")
    assert out.returncode == 2, out
    assert json.loads(out.stdout)["error"]["code"] == "invalid_argument"


def test_without_the_archive_the_page_follows_this_hosts_inboxes(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    [b] = sqlite_cluster.up("B")
    bob = b.listen("bob")
    web = start_web(b)
    web_servers.append(web)
    page = browser.new_page()
    page.goto(web.url)
    page.wait_for_selector("#archive-state.off")
    page.wait_for_selector("#live.on")
    sent = b.cli_json("send", "--as", "carol", "--to", "bob", "--subject", "local", "inbox only")
    bob.next_message()
    item = page.wait_for_selector(f'#feed li[data-id="{sent["id"]}"]')
    assert item.query_selector(".text").inner_text() == "inbox only"
    page.wait_for_selector(f'#feed li[data-id="{sent["id"]}"] .receipt')
    page.fill('#search-form [name="q"]', "inbox")
    page.click('#search-form button[type="submit"]')
    page.wait_for_selector(f'#results li[data-id="{sent["id"]}"] mark')
    assert "inboxes" in page.inner_text("#search-source")
    page.close()
