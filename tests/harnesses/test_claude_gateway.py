"""Claude Code 2.1.332 joined through a gateway with nothing of crossintercom beside it: `setup
claude-code --gateway` writes an http MCP entry and a curl wake hook; against the mock model, a
tool call over HTTP MCP sends mail the peer receives, and mail from the peer wakes the idle
session framed, nothing raw (docs/agents.md#mcp-over-http). The gateway runs with TLS (a test
CA) on the peer's host; Claude Code's environment holds only the token and the CA, no
crossintercom setting."""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, cli_json, run_cli, wait_for
from tests.harnesses import kits
from tests.harnesses.agentmail import (
    WORKER,
    Hostile,
    joins,
    peer_receives,
    peer_send,
    shown_only_framed,
)
from tests.harnesses.isolation import HarnessEnv
from tests.harnesses.mockmodel import MockModel
from tests.harnesses.test_claude_code import Session, sends_when_asked
from tests.pgtls import make_certificates


@dataclasses.dataclass
class Joined:
    host: kits.Kit  # the gateway's host: the peer's commands run here
    sandbox: kits.Kit  # Claude Code, with only the token and the CA


@pytest.fixture
def joined(mock_model: MockModel, harness_env: HarnessEnv) -> Iterator[Joined]:
    kit = kits.make("claude", mock_model, harness_env)
    certs = Path(tempfile.mkdtemp(prefix="gwc-", dir=harness_env.root))
    ca = make_certificates(certs).ca
    ready = certs / "ready"
    gateway = subprocess.Popen(
        [
            *CLI,
            *("gateway", "serve", "--listen", "127.0.0.1:0", "--mcp-listen", "127.0.0.1:0"),
            *("--cert", str(certs / "server.crt"), "--key", str(certs / "server.key")),
            *("--ready-file", str(ready)),
        ],
        env=kit.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(ready.read_text().split()) == 2 if ready.exists() else False, 30,
                 "the gateway to listen")  # fmt: skip
        mcp_port = int(ready.read_text().split()[1])
        token = cli_json(kit.env, "gateway", "grant", "--as", WORKER)["token"]
        url = f"https://localhost:{mcp_port}"
        out = run_cli(
            kit.env,
            *("setup", "claude-code", "--as", WORKER, "--dir", str(kit.cwd)),
            *("--gateway", url, "--gateway-ca", str(ca)),
        )
        assert out.returncode == 0, out.stderr
        joins(kit)
        env = {k: v for k, v in kit.env.items() if not k.startswith("CROSSINTERCOM_")}
        env |= {"CROSSINTERCOM_TOKEN": token, "NODE_EXTRA_CA_CERTS": str(ca)}
        yield Joined(kit, dataclasses.replace(kit, env=env))
    finally:
        gateway.terminate()
        _, log = gateway.communicate(timeout=30)
        assert "cig_" not in log  # no token in the gateway's log


def test_claude_code_over_http_mcp_sends_and_is_woken_by_curl(
    joined: Joined, mock_model: MockModel
) -> None:
    token, prompt = uuid.uuid4().hex[:12], f"send the planner a hello {uuid.uuid4().hex[:6]}"
    mock_model.responder = sends_when_asked(prompt, token)
    session = Session(joined.sandbox)
    try:
        session.say(prompt)
        first = session.result(timeout=120)
        assert first.get("subtype") == "success", first
        got = peer_receives(joined.host, token)
        assert "worker" in str(got["from"])

        # Idle now: mail from the peer comes back through the curl Stop hook, framed.
        hostile = Hostile()
        peer_send(joined.host, hostile.text)
        woken = mock_model.wait_for(lambda r: hostile.before in r.all_text(), timeout=120)
        assert shown_only_framed(woken, hostile), woken.all_text()[-3000:]
        for req in mock_model.model_requests():
            assert hostile.fake_end not in req.all_text()
        session.result(timeout=120)
    finally:
        session.running.stop()
