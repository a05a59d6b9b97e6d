"""The OpenCode plugin as `setup opencode --gateway` writes it: on an idle session it long-polls
the gateway's ``/wait`` with fetch (the token from ``$CROSSINTERCOM_TOKEN`` in the header only),
confirms the hand-over's key, and starts the next turn with the framed text; it confirms nothing
once disposed, and a refused token ends the watch (docs/agents.md#opencode). Node stands in for
OpenCode and a small HTTP server for the gateway."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from crossintercom.agents.setup.common import Agent
from crossintercom.agents.setup.opencode import OPENCODE_POLL_S, plugin_source
from tests.agents.test_setup import IDLE, prompted
from tests.agents.test_setup import _drive as drive
from tests.conftest import run_cli, wait_for

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs node")

TOKEN = "cig_test-token-not-in-any-file"
HANDED = "[crossintercom: 1 message from planner@host]\nreview #7\n"


class FakeGateway:
    """Answers the first ``/wait`` with ``status`` once released (200: a key and ``HANDED``),
    later ones with 204 when it closes; records every request."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[tuple[str, str, str]] = []  # method, path, Authorization
        self.release = threading.Event()
        self.closing = threading.Event()
        self.answered = threading.Event()  # the first /wait answered (or its client gone)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                fake.requests.append(
                    (self.command, self.path, self.headers.get("Authorization", ""))
                )
                first = fake.paths().count(self.path) == 1
                status = 204
                body = b""
                if self.path.startswith("/wait?") and first:
                    fake.release.wait(30)
                    status = fake.status
                    body = f"k3y_1\n{HANDED}".encode() if fake.status == 200 else b""
                elif self.path.startswith("/wait?"):
                    fake.closing.wait(30)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the plugin aborted its poll
                if first:
                    fake.answered.set()

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    fake = FakeGateway()
    try:
        yield fake
    finally:
        fake.release.set()
        fake.closing.set()
        fake.server.shutdown()
        fake.server.server_close()


def _drive(tmp_path: Path, url: str, body: str) -> subprocess.Popen[str]:
    agent = Agent(name="worker", supervisor=None, command=["/nowhere/ci"], env={}, gateway=url)
    plugin = tmp_path / "crossintercom.js"
    plugin.write_text(plugin_source(agent))
    env = {"PATH": "/usr/bin:/bin", "CROSSINTERCOM_TOKEN": TOKEN}
    return drive(plugin, tmp_path / "drive.mjs", body, env)


def test_the_plugin_polls_confirms_and_prompts_with_the_framed_text(
    gateway: FakeGateway, tmp_path: Path
) -> None:
    node = _drive(tmp_path, gateway.url + "/", IDLE)
    try:
        wait_for(lambda: bool(gateway.requests), 30, "the plugin's long poll")
        gateway.release.set()
        prompt = prompted(node)
    finally:
        if node.poll() is None:
            node.kill()
    assert prompt["path"] == {"id": "s1"}
    assert prompt["body"]["parts"][0]["text"] == HANDED
    assert gateway.paths() == [
        f"/wait?format=text&timeout={OPENCODE_POLL_S}",
        "/wait/shown?key=k3y_1",
    ]
    assert [(m, auth) for m, _, auth in gateway.requests] == [
        ("GET", f"Bearer {TOKEN}"),
        ("POST", f"Bearer {TOKEN}"),
    ]


def test_a_disposed_plugin_confirms_nothing(gateway: FakeGateway, tmp_path: Path) -> None:
    body = IDLE + "process.stdin.once('data', async () => { await hooks.dispose(); "
    body += "console.log('disposed'); });\n"
    node = _drive(tmp_path, gateway.url, body)
    try:
        wait_for(lambda: bool(gateway.requests), 30, "the plugin's long poll")
        assert node.stdin is not None and node.stdout is not None
        node.stdin.write("dispose\n")
        node.stdin.flush()
        assert node.stdout.readline().strip() == "disposed"
        gateway.release.set()
        assert gateway.answered.wait(30)
        node.stdin.write("more\n")  # the plugin would have confirmed by now: give it time
        node.stdin.flush()
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(2)
    finally:
        if node.poll() is None:
            node.kill()
        node.communicate()
    assert gateway.paths() == [f"/wait?format=text&timeout={OPENCODE_POLL_S}"]


def test_a_refused_token_ends_the_watch(gateway: FakeGateway, tmp_path: Path) -> None:
    gateway.status = 401
    gateway.release.set()
    node = _drive(tmp_path, gateway.url, IDLE + "console.log('idle reported');\n")
    try:
        said, err = node.communicate(timeout=30)  # nothing more pending: node ends
    finally:
        if node.poll() is None:
            node.kill()
    assert "idle reported" in said, err
    assert len(gateway.requests) == 1


def test_setup_writes_the_gateway_plugin_without_the_token(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    url = "https://gw.example:8443"
    env = {**cli_env, "CROSSINTERCOM_TOKEN": TOKEN}
    args = ("setup", "opencode", "--as", "worker", "--dir", str(tmp_path), "--gateway", url)
    out = run_cli(env, *args)
    assert out.returncode == 0, out.stderr
    plugin = (tmp_path / ".opencode" / "plugins" / "crossintercom.js").read_text()
    assert f'const GATEWAY = {{"url": "{url}", "tokenEnv": "CROSSINTERCOM_TOKEN"}};' in plugin
    assert f"const WAIT_S = {OPENCODE_POLL_S};" in plugin
    entry = json.loads((tmp_path / "opencode.json").read_text())["mcp"]["crossintercom"]
    assert entry["type"] == "remote" and entry["url"] == f"{url}/mcp"
    for written in tmp_path.rglob("*"):
        if written.is_file():
            assert TOKEN not in written.read_text()
    local = run_cli(cli_env, "setup", "opencode", "--as", "w2", "--dir", str(tmp_path / "l"))
    assert local.returncode == 0, local.stderr
    local_plugin = tmp_path / "l" / ".opencode" / "plugins" / "crossintercom.js"
    assert "const GATEWAY = null;" in local_plugin.read_text()
