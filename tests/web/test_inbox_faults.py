"""The overseer page outlives a failing inbox: while the human session's inbox file is immutable
or its disk full under traffic, the page keeps serving, ``/api/health`` answers 503
``inbox_unavailable``, and the page and its roster carry the host's warning; once the fault
clears, every message sent meanwhile reaches the feed exactly once, by itself (docs/web.md).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

import pytest

from crossintercom.inbox import Inbox
from tests.conftest import wait_for
from tests.inbox_fault import KINDS, NEEDS_ROOT, inbox_fault
from tests.relay.conftest import Cluster
from tests.web.conftest import WebServer, start_web
from tests.web.test_overseer import request

pytestmark = NEEDS_ROOT

RECOVERY_S = 30.0
ACKED = {"delivered", "queued"}


@pytest.mark.parametrize("kind", KINDS)
def test_the_page_shows_a_failing_inbox_and_resumes_by_itself(
    sqlite_cluster: Cluster, web_servers: list[WebServer], kind: str
) -> None:
    b = sqlite_cluster.host("B", relay=False)
    inbox_dir = b.settings.inbox_dir
    faults = inbox_fault(kind, inbox_dir)
    fault = next(faults)
    try:
        web = start_web(b, "--as", "boss")
        web_servers.append(web)
        auth = {"Authorization": f"Bearer {web.token}"}

        def get(path: str) -> tuple[int, Any]:
            assert web.proc.poll() is None, "the page's server exited"
            return request(web.base + path, headers=auth)

        def feed() -> Counter[str]:
            status, items = get("/api/feed")
            assert status == 200, items
            return Counter(m["id"] for m in items["messages"])

        def saved_for_boss() -> set[str]:
            """Messages whose receipt says boss has them (the traffic log shows the others
            as they went: queued, not delivered)."""
            items = get("/api/feed")[1]["messages"]
            return {
                m["id"]
                for m in items
                for r in m["recipients"]
                if r["name"] == "boss" and r["outcome"] in ("delivered", "shown")
            }

        def boss_warned() -> bool:
            warnings = get("/api/roster")[1]["warnings"]
            return any("boss cannot" in w and " since " in w for w in warnings)

        assert get("/api/health") == (200, {"ok": True, "warnings": []})
        sid = b.identity("boss").id
        wait_for((inbox_dir / f"{sid}.sqlite").exists, 20, "the page's inbox to exist")
        mate = b.client("mate")
        first = mate.send("boss", "before")
        assert first.outcome.value == "delivered", first
        wait_for(lambda: first.id in feed(), 20, "the first message in the feed")

        fault.on(sid)
        sent = []
        for k in range(3):
            result = mate.send("boss", f"during the fault {k}")
            assert result.outcome.value in ACKED, result
            sent.append(result.id)
        wait_for(lambda: get("/api/health")[0] == 503, 30, "the health check to say 503")
        status, body = get("/api/health")
        assert (status, body["error"]["code"]) == (503, "inbox_unavailable"), body
        wait_for(boss_warned, 30, "the roster to carry the warning")
        page = get("/")[1]
        banner = re.search(r'<div id="warnings"[^>]*>(.*?)</div>', page, re.S)
        assert banner is not None and "boss cannot" in banner.group(1), page
        assert not set(sent) & saved_for_boss(), "a message not saved was shown as delivered"
        fault.off()
        cleared = time.monotonic()

        wait_for(lambda: set(sent) <= saved_for_boss(), RECOVERY_S, "the mail sent meanwhile")
        print(
            f"inbox fault ({kind}): the page's feed had all {len(sent)} messages "
            f"{time.monotonic() - cleared:.1f} s after it cleared"
        )
        wait_for(lambda: get("/api/health")[0] == 200, RECOVERY_S, "the health check to pass")
        wait_for(lambda: not boss_warned(), RECOVERY_S, "the warning to clear")
        assert 'id="warnings" role="alert" hidden' in get("/")[1]
        shown = feed()
        assert all(shown[m] == 1 for m in [first.id, *sent]), shown
        with Inbox.view(inbox_dir, sid) as box:
            held = Counter(e.id for e in box.messages())
        assert all(held[m] == 1 for m in [first.id, *sent]), held
    finally:
        faults.close()


def test_the_banner_comes_and_goes_in_a_browser(
    sqlite_cluster: Cluster, browser: Any, web_servers: list[WebServer]
) -> None:
    b = sqlite_cluster.host("B", relay=False)
    inbox_dir = b.settings.inbox_dir
    faults = inbox_fault("immutable", inbox_dir)
    fault = next(faults)
    try:
        web = start_web(b, "--as", "boss")
        web_servers.append(web)
        page = browser.new_page()
        page.goto(web.url)
        page.wait_for_selector("#live.on")
        assert page.is_hidden("#warnings")
        mate = b.client("mate")
        assert mate.send("boss", "before").outcome.value == "delivered"
        sid = b.identity("boss").id
        wait_for((inbox_dir / f"{sid}.sqlite").exists, 20, "the page's inbox to exist")

        fault.on(sid)
        during = mate.send("boss", "during the fault")
        assert during.outcome.value in ACKED, during
        banner = page.wait_for_selector("#warnings:not([hidden])", timeout=30_000)
        assert banner is not None and "boss cannot" in banner.inner_text()
        fault.off()
        saved = f'#feed li[data-id="{during.id}"] .receipt.delivered'
        page.wait_for_selector(saved, timeout=RECOVERY_S * 1000)
        page.wait_for_selector("#warnings[hidden]", state="attached", timeout=RECOVERY_S * 1000)
        page.close()
    finally:
        faults.close()
