"""MCP over streamable HTTP from the gateway (TLS, a test CA): a harness with only a URL and a
token header, nothing installed beside it, reaches the token's session on host A and talks with
host B; a bad, revoked or missing token gets the gateway's codes (docs/agents.md#mcp-over-http)."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.agents.conftest import Mcp, until
from tests.conftest import run_cli, sessions, wait_for
from tests.gateway.conftest import Gateway
from tests.procs import clean_env
from tests.relay.conftest import Host


def _http(gw: Gateway, token: str) -> httpx2.AsyncClient:
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.AsyncClient(verify=ctx, headers=headers, timeout=60.0)


@asynccontextmanager
async def remote_mcp(gw: Gateway, token: str) -> AsyncIterator[Mcp]:
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(_http(gw, token))
        url = f"https://localhost:{gw.mcp_port}/mcp"
        read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        yield Mcp(session, "remote")


def _online(a: Host, name: str) -> bool:
    return any(s["name"] == name and s["online"] for s in sessions(a.home, quiet=True) or ())


def test_a_harness_with_only_a_url_and_a_token(gateway: tuple[Gateway, Host, Host]) -> None:
    gw, a, b = gateway
    token = Path(gw.grant("worker")).read_text().strip()
    lead = b.listen("lead")
    asyncio.run(_talk(gw, token, a, b))
    assert lead.next_message(30)["message"] == "over HTTP MCP"
    lead.stop()


async def _talk(gw: Gateway, token: str, a: Host, b: Host) -> None:
    async with remote_mcp(gw, token) as worker:
        tools = {t.name for t in (await worker.session.list_tools()).tools}
        assert tools == {"whoami", "list_sessions", "send", "ask", "reply", "pending", "inbox"}
        me = await worker.data("whoami")
        assert (me["name"], me["host"]) == ("worker", "A"), me
        await until(lambda: _online(a, "worker"), 30, "the gateway to hold worker on A")
        sent = await worker.data("send", to="lead@B", message="over HTTP MCP")
        assert sent["outcome"] == "delivered", sent
        out = await asyncio.to_thread(
            b.cli_json, "send", "--as", "lead", "--to", "worker@A", "to the HTTP MCP"
        )
        got: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not (got := await worker.mail("inbox")):
            assert loop.time() < deadline, "no mail reached the HTTP MCP session"
            await asyncio.sleep(0.2)
        assert [m["id"] for m in got] == [out["id"]]
        assert got[0]["message"] == "to the HTTP MCP"


def test_http_mcp_refuses_without_a_live_token(gateway: tuple[Gateway, Host, Host]) -> None:
    gw, a, _ = gateway
    token = Path(gw.grant("worker")).read_text().strip()
    asyncio.run(_refusals(gw, token, a))


async def _refusals(gw: Gateway, token: str, a: Host) -> None:
    url = f"https://localhost:{gw.mcp_port}/mcp"
    for bad, code in (("", "gateway_no_token"), ("cig_nothing", "gateway_token_unknown")):
        async with _http(gw, bad) as http:
            answer = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert answer.status_code == 401 and answer.json()["error"]["code"] == code, answer.text
    async with remote_mcp(gw, token) as worker:
        await worker.data("whoami")
        await until(lambda: _online(a, "worker"), 30, "the gateway to hold worker on A")
        await asyncio.to_thread(a.cli_json, "gateway", "revoke", "worker")
        # The held session ends within seconds, and the token opens nothing any more.
        await until(lambda: not _online(a, "worker"), 30, "the revoked grant's session to end")
    async with _http(gw, token) as http:
        answer = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "gateway_token_revoked"


def _setup_curl_hook(gw: Gateway, project: Path) -> dict[str, Any]:
    """`setup claude-code --gateway` for worker in ``project`` (twice: the same files, one
    hook); the Stop hook it wrote."""
    args = ("setup", "claude-code", "--as", "worker", "--dir", str(project))
    url = f"https://localhost:{gw.mcp_port}"
    for _ in range(2):
        out = run_cli(clean_env(), *args, "--gateway", url, "--gateway-ca", str(gw.certs.ca))
        assert out.returncode == 0, out.stderr
    settings = json.loads((project / ".claude" / "settings.local.json").read_text())
    (group,) = settings["hooks"]["Stop"]
    (hook,) = group["hooks"]
    return dict(hook)


def test_setup_writes_the_http_entry_and_a_curl_hook_that_wakes(
    gateway: tuple[Gateway, Host, Host],
) -> None:
    gw, a, b = gateway
    token = Path(gw.grant("worker")).read_text().strip()
    project = gw.root / "project"
    url = f"https://localhost:{gw.mcp_port}"
    _setup_curl_hook(gw, project)
    entry = json.loads((project / ".mcp.json").read_text())["mcpServers"]["crossintercom"]
    assert entry == {
        "type": "http",
        "url": f"{url}/mcp",
        "headers": {"Authorization": "Bearer ${CROSSINTERCOM_TOKEN}"},
    }
    settings = json.loads((project / ".claude" / "settings.local.json").read_text())
    (group,) = settings["hooks"]["Stop"]
    (hook,) = group["hooks"]
    assert hook["asyncRewake"] is True and "curl" in hook["command"]
    assert "SessionStart" not in settings["hooks"]  # nothing of crossintercom runs here
    for written in (project / ".mcp.json", project / ".claude" / "settings.local.json"):
        assert token not in written.read_text()

    # The hook as Claude Code runs it (a shell), woken by mail from B.
    waiting = subprocess.Popen(
        ["sh", "-c", hook["command"]],
        env=clean_env(CROSSINTERCOM_TOKEN=token),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _online(a, "worker"), 30, "the gateway to hold worker for the hook")
        sent = b.cli_json("send", "--as", "lead", "--to", "worker@A", "wake over curl")
        _, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 2, err
    assert f"id={sent['id']}" in err and "wake over curl" in err, err
    assert token not in err
    # Its harness (here: the test) read it, so the hook confirmed: it was marked shown.
    assert _poll(gw, token, 1).communicate(timeout=90)[0] == ""


def _poll(gw: Gateway, token: str, timeout: int, path: str = "") -> subprocess.Popen[str]:
    """``curl`` of the gateway's /wait (or, with ``path``, that path), the token on stdin."""
    url = f"https://localhost:{gw.mcp_port}" + (path or f"/wait?format=text&timeout={timeout}")
    method = ["-X", "POST"] if path else []
    proc = subprocess.Popen(
        ["curl", "-sS", "--fail", "--cacert", str(gw.certs.ca), *method, "-H", "@-", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(f"Authorization: Bearer {token}\n")
    proc.stdin.close()
    proc.stdin = None
    return proc


def _running(pid: int) -> bool:
    """Not exited (a zombie counts as exited: whoever reaps it, it runs no more)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_curl_hook_outliving_its_harness_marks_nothing_shown(
    gateway: tuple[Gateway, Host, Host],
) -> None:
    """The harness ends while its wake hook's curl waits; mail then comes and is handed to the
    curl. The hook finds its harness gone and confirms nothing: the mail stays unseen, handed
    to the next poll, and is marked shown only once that poll's key is confirmed."""
    gw, a, b = gateway
    token = Path(gw.grant("worker")).read_text().strip()
    hook = _setup_curl_hook(gw, gw.root / "project")
    err = gw.root / "hook.err"
    # The "harness": a process that starts the hook through a shell, as Claude Code does.
    harness = subprocess.Popen(
        ["sh", "-c", 'sh -c "$HOOK" >/dev/null 2>"$ERR" </dev/null & echo $!; exec sleep 600'],
        env=clean_env(CROSSINTERCOM_TOKEN=token, HOOK=hook["command"], ERR=str(err)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert harness.stdout is not None
    hook_pid = int(harness.stdout.readline())
    wait_for(lambda: _online(a, "worker"), 30, "the gateway to hold worker for the hook")
    harness.kill()  # it ends; its hook's curl waits on
    harness.communicate()
    assert _running(hook_pid)
    sent = b.cli_json("send", "--as", "lead", "--to", "worker@A", "after the harness ended")
    wait_for(lambda: not _running(hook_pid), 120, "the hook to be handed the mail and exit")
    assert err.read_text() == ""  # it handed nothing on, to no one
    out, _ = _poll(gw, token, 60).communicate(timeout=90)
    key, text = out.split("\n", 1)
    assert f"id={sent['id']}" in text and "after the harness ended" in text, out
    # Confirmed, it is shown: the next poll waits its timeout out with nothing.
    confirm = f"/wait/shown?key={key}"
    done = _poll(gw, token, 0, confirm).communicate(timeout=60)
    assert done == ("", ""), done
    assert _poll(gw, token, 1).communicate(timeout=90)[0] == ""
    again = _poll(gw, token, 0, confirm)
    again.communicate(timeout=60)
    assert again.returncode == 22  # curl --fail: 404, the key was used


def test_a_poll_whose_client_is_gone_shows_nothing(gateway: tuple[Gateway, Host, Host]) -> None:
    gw, a, b = gateway
    token = Path(gw.grant("worker")).read_text().strip()

    def poll(timeout: int) -> subprocess.Popen[str]:
        return _poll(gw, token, timeout)

    gone = poll(600)
    wait_for(lambda: _online(a, "worker"), 30, "the gateway to hold worker for the poll")
    gone.kill()
    gone.communicate()
    sent = b.cli_json("send", "--as", "lead", "--to", "worker@A", "after the poll was gone")
    # The dead poll showed nothing: the next one is handed the message.
    out, err = poll(60).communicate(timeout=90)
    assert f"id={sent['id']}" in out and "after the poll was gone" in out, (out, err)


def test_setup_writes_codex_and_opencode_remote_servers_their_binaries_take(
    gateway: tuple[Gateway, Host, Host],
) -> None:
    """`setup codex|opencode --gateway`: Codex's streamable HTTP server and curl Stop hook,
    OpenCode's remote server and its wake plugin's long poll; each real binary reads the entry
    as a remote server (OpenCode connects to it through the gateway with the token)."""
    from tests.harnesses import install
    from tests.harnesses.isolation import require_harness
    from tests.harnesses.test_opencode import sdk_installed

    gw, _a, _b = gateway
    token = Path(gw.grant("worker")).read_text().strip()
    url = f"https://localhost:{gw.mcp_port}"
    home = gw.root / "harness-home"
    home.mkdir()
    codex_home, project = home / ".codex", home / "project"
    for harness, where in (("codex", codex_home), ("opencode", project)):
        args = ("setup", harness, "--as", "worker", "--dir", str(where), "--gateway", url)
        out = run_cli(clean_env(), *args, "--gateway-ca", str(gw.certs.ca))
        assert out.returncode == 0, out.stderr
    hooks = json.loads((codex_home / "hooks.json").read_text())
    assert "curl" in json.dumps(hooks) and "codex-hook" in json.dumps(hooks)
    plugin = (project / ".opencode" / "plugins" / "crossintercom.js").read_text()
    assert f'const GATEWAY = {{"url": "{url}", "tokenEnv": "CROSSINTERCOM_TOKEN"}};' in plugin
    sdk_installed(project / ".opencode")
    for written in (
        codex_home / "config.toml",
        codex_home / "hooks.json",
        project / "opencode.json",
        project / ".opencode" / "plugins" / "crossintercom.js",
    ):
        assert token not in written.read_text()
    env = install.with_node22(
        clean_env(
            HOME=str(home),
            CODEX_HOME=str(codex_home),
            CROSSINTERCOM_TOKEN=token,
            NODE_EXTRA_CA_CERTS=str(gw.certs.ca),
            OPENCODE_DISABLE_AUTOUPDATE="1",
            OPENCODE_DISABLE_MODELS_FETCH="1",
            OPENCODE_DISABLE_DEFAULT_PLUGINS="1",
        )
    )

    def mcp_list(harness: str, *extra: str, cwd: Path) -> tuple[str, str]:
        argv = [*require_harness(harness), "mcp", "list", *extra]
        kw: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 180}
        done = subprocess.run(argv, env=env, cwd=cwd, check=False, **kw)
        assert done.returncode == 0, (done.stdout, done.stderr)
        return done.stdout, done.stderr

    (server,) = json.loads(mcp_list("codex", "--json", cwd=home)[0])
    assert server["name"] == "crossintercom" and server["enabled"], server
    assert server["transport"] == {
        **server["transport"],
        "type": "streamable_http",
        "url": f"{url}/mcp",
        "bearer_token_env_var": "CROSSINTERCOM_TOKEN",
    }
    said = "".join(mcp_list("opencode", cwd=project))
    assert "✓ crossintercom" in said and "connected" in said, said  # reached through the gateway
