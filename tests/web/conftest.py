"""Browser tests of the overseer page: Debian's Chromium driven by Playwright's Python API
(launched on that executable; no browser download), against simulated hosts sharing a store.

Without /usr/bin/chromium the tests are skipped on a developer's machine and fail under CI
(``CROSSINTERCOM_REQUIRE_BROWSER=1``, which .ci/run sets, or ``CROSSINTERCOM_REQUIRE_PG=1``):
a browser test that cannot run must never pass silently there.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from crossintercom.storage import migrate
from tests.relay.conftest import CLI, Cluster, Host, wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REQUIRE_ENV = ("CROSSINTERCOM_REQUIRE_BROWSER", "CROSSINTERCOM_REQUIRE_PG")


def _browser_required() -> bool:
    return any(os.environ.get(name) == "1" for name in REQUIRE_ENV)


# One per module, not per session: Playwright's sync API keeps its event loop running in the
# worker's thread while it is open, and a test of another folder that the same worker runs
# next may call asyncio.run.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: apt-get install -y chromium"
        if _browser_required():
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@dataclass
class WebServer:
    proc: subprocess.Popen[str]
    info: dict[str, Any]

    @property
    def url(self) -> str:
        return str(self.info["url"])

    @property
    def base(self) -> str:
        return "http://" + str(self.info["listen"])

    @property
    def token(self) -> str:
        return self.url.rsplit("token=", 1)[1]

    @property
    def port(self) -> int:
        return int(str(self.info["listen"]).rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def start_web(host: Host, *args: str, timeout: float = 30) -> WebServer:
    """`crossintercom web --listen 127.0.0.1:0 --json` on ``host``; returns once it printed
    where it listens."""
    proc = subprocess.Popen(
        [*CLI, "web", "--listen", "127.0.0.1:0", *args, "--json"],
        env=host.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    # A selector, not select(): a long test run can have descriptors past select()'s 1024.
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(0.2):
                line = proc.stdout.readline()
                if line:
                    return WebServer(proc, json.loads(line))
            if proc.poll() is not None:
                break
    proc.kill()
    _, err = proc.communicate(timeout=5)
    raise AssertionError(f"web did not start: {err}")


def open_page(browser: Any, web: WebServer, **options: Any) -> Any:
    """A new tab on the page, once its event stream is live. The CSP is bypassed only so that
    tests can evaluate script; escaping alone keeps text inert (checked in each test)."""
    page = browser.new_page(bypass_csp=True, **options)
    page.goto(web.url)
    page.wait_for_selector("#live.on")
    return page


def wait_feed(page: Any, ids: list[str], what: str) -> None:
    """Until the feed shows exactly ``ids``, in that order (after a filter, say)."""
    script = "els => els.map(e => e.dataset.id)"
    wait_for(lambda: page.eval_on_selector_all("#feed > li", script) == ids, 30, what)


def hosts_for(cluster: Cluster, n: int, archive: bool) -> list[Host]:
    """``n`` simulated hosts (A, B, …) over the cluster's store, the archive on or off before
    their relays start."""
    hosts = [cluster.host(h, relay=False) for h in "ABCDEFGH"[:n]]
    if archive:
        assert hosts[0].cli_json("archive", "on")["enabled"] is True
    for h in hosts:
        h.start_relay(wait=False)
    for h in hosts:
        h.wait_relay()
    return hosts


@pytest.fixture
def web_servers() -> Iterator[list[WebServer]]:
    started: list[WebServer] = []
    try:
        yield started
    finally:
        for w in started:
            w.stop()


@pytest.fixture
def sqlite_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Browser tests run on the SQLite store: the page reads the store through the same
    archive code on both backends, which tests/storage checks on each."""
    url = f"sqlite:///{tmp_path / 'mailbox.sqlite'}"
    migrate.upgrade(url)
    c = Cluster(url)
    try:
        yield c
    finally:
        c.close()
