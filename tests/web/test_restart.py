"""Stopping and restarting the page (docs/web.md, "Restarts"), on two hosts without the archive
and five with it: SIGTERM stops it as Ctrl-C does (``web.token`` removed, nothing logged as an
error, even with a page open); a restart keeps the token while ``web.key`` exists, so an open
tab goes live again by itself, can still send and shows mail from another host; without the
key the open tab says at once that the address changed. ``/healthz`` answers without the
token.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.relay.conftest import Cluster, wait_for
from tests.web.conftest import WebServer, hosts_for, open_page, start_web


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize(("n", "archive"), [(2, False), (5, True)])
def test_sigterm_cleans_up_and_a_restart_keeps_the_open_tab_working(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer], n: int, archive: bool
) -> None:
    a, b = hosts_for(sqlite_cluster, n, archive)[:2]
    bob = b.listen("bob")
    a.listen("alice")
    b.wait_sees("alice", "A")
    port = free_port()
    listen = ("--listen", f"127.0.0.1:{port}")
    web = start_web(b, "--as", "boss", *listen)
    token_file = Path(web.info["token_file"])
    assert token_file.exists()
    with urllib.request.urlopen(web.base + "/healthz", timeout=10) as resp:  # no token
        assert resp.read() == b"ok"
    page = open_page(browser, web)
    page.evaluate("window.__sameDocument = true")

    # SIGTERM, with the page open: a clean stop, the token file gone, no error logged.
    web.proc.send_signal(15)
    web.proc.wait(30)
    err = web.proc.stderr.read() if web.proc.stderr else ""
    web.stop()
    assert "Traceback" not in err and "ERROR" not in err, err
    assert not token_file.exists()
    page.wait_for_selector("#live.off")

    # Restarted on the same address: the same token, the tab live again without a reload,
    # and its compose still accepted (the CSRF token is the same too).
    again = start_web(b, "--as", "boss", *listen)
    web_servers.append(again)
    assert again.token == web.token
    page.wait_for_selector("#live.on", timeout=30_000)
    assert page.evaluate("window.__sameDocument") is True
    page.fill('#compose-form [name="to"]', "bob")
    page.fill('#compose-form [name="message"]', "after the restart")
    page.click('#compose-form button[type="submit"]')
    page.wait_for_function("document.getElementById('compose-result').textContent.includes('id')")
    sent = json.loads(page.inner_text("#compose-result"))
    assert sent["outcome"] == "delivered", sent
    assert bob.next_message()["id"] == sent["id"]
    # Mail between the simulated hosts still reaches the restarted page.
    remote = a.cli_json("send", "--as", "alice", "--to", "bob@B", "across a restart")
    page.wait_for_selector(f'#feed li[data-id="{remote["id"]}"]', timeout=30_000)

    # Without the key the token changes: the open tab says so at once.
    again.stop()
    (b.home / "web.key").unlink()
    third = start_web(b, "--as", "boss", *listen)
    web_servers.append(third)
    assert third.token != web.token
    page.wait_for_selector("#reload:not([hidden])", timeout=30_000)
    wait_for(lambda: page.inner_text("#live") == "token changed", 10, "the badge to say so")
    page.close()
