"""The Pi extension as `setup pi --gateway` writes it, run by Node 22 with a stand-in for Pi's
API and for the gateway: in a live mode it long-polls ``/wait`` with fetch (the token from
``$CROSSINTERCOM_TOKEN``, in the header only), confirms the key, wakes with ``sendMessage`` as
a followUp and polls again; ``session_shutdown`` aborts the poll. `setup pi --gateway` writes
the streamable HTTP server into ``.pi/mcp.json``, no token in any file (docs/agents.md#pi)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from crossintercom.agents.setup.common import Agent
from crossintercom.agents.setup.pi import PI_POLL_S, PI_TOOL_TIMEOUT_S, extension_source
from tests.agents.test_opencode_gateway_plugin import HANDED, TOKEN, FakeGateway, gateway
from tests.agents.test_pi_extension import DRIVER, ends_by_itself, node22
from tests.conftest import run_cli, wait_for

__all__ = ["gateway", "node22"]  # fixtures


def test_the_extension_polls_confirms_wakes_and_polls_again(
    node22: str, gateway: FakeGateway, tmp_path: Path
) -> None:
    agent = Agent(
        name="worker", supervisor=None, command=["/nowhere/ci"], env={}, gateway=gateway.url
    )
    extension = tmp_path / "crossintercom.ts"
    extension.write_text(extension_source(agent))
    driver = tmp_path / "drive.mjs"
    driver.write_text(DRIVER)
    env = {"PATH": "/usr/bin:/bin", "EXTENSION": str(extension), "CROSSINTERCOM_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [node22, str(driver), "rpc", "ok"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    poll = f"/wait?format=text&timeout={PI_POLL_S}"
    try:
        wait_for(lambda: bool(gateway.requests), 30, "the extension's long poll")
        gateway.release.set()
        assert proc.stdout is not None
        sent = json.loads(proc.stdout.readline())
        assert sent["options"] == {"triggerTurn": True, "deliverAs": "followUp"}
        assert sent["message"] == {
            "customType": "crossintercom",
            "content": HANDED,
            "display": True,
        }
        wait_for(lambda: gateway.paths().count(poll) == 2, 30, "the next poll")
        ends_by_itself(proc, "quit\n")  # session_shutdown aborts the poll: node ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert gateway.paths() == [poll, "/wait/shown?key=k3y_1", poll]
    assert {auth for _, _, auth in gateway.requests} == {f"Bearer {TOKEN}"}


def test_setup_writes_the_http_server_and_the_extension_without_the_token(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    url = "https://gw.example:8443"
    env = {**cli_env, "CROSSINTERCOM_TOKEN": TOKEN}
    args = ("setup", "pi", "--as", "worker", "--dir", str(tmp_path), "--gateway", url)
    out = run_cli(env, *args)
    assert out.returncode == 0, out.stderr
    entry = json.loads((tmp_path / ".pi" / "mcp.json").read_text())["mcpServers"]["crossintercom"]
    assert entry == {
        "url": f"{url}/mcp",
        "headers": {"Authorization": "Bearer ${CROSSINTERCOM_TOKEN}"},
        "exposure": "direct",
        "timeout": PI_TOOL_TIMEOUT_S,
    }
    extension = (tmp_path / ".pi" / "extensions" / "crossintercom.ts").read_text()
    assert f'= {{"url": "{url}", "tokenEnv": "CROSSINTERCOM_TOKEN"}};' in extension
    for written in tmp_path.rglob("*"):
        if written.is_file():
            assert TOKEN not in written.read_text()
