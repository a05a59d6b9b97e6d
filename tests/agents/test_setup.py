"""`crossintercom setup`: --print writes nothing; setup keeps every other user entry and is
idempotent; the OpenCode plugin starts a turn when mail comes and stops its waiter when
OpenCode disposes it (run in node with a stand-in for OpenCode's client). The harnesses' own
binaries run the written files in tests/harnesses."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.agents.conftest import waiting
from tests.conftest import pid_alive, run_cli, wait_for

COMMAND = ["--command", "crossintercom"]
# What OpenCode hands a plugin's event hook when a session goes idle.
IDLE = "await hooks.event({ event: { type: 'session.idle', properties: { sessionID: 's1' } } });\n"


def setup(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    out = run_cli(env, "setup", *args, *COMMAND)
    assert out.returncode == 0, out.stderr
    return out


def test_print_shows_a_working_config_and_writes_nothing(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    out = setup(cli_env, "claude-code", "--as", "worker", "--dir", str(tmp_path), "--print")
    assert list(tmp_path.iterdir()) == []
    assert f"# {tmp_path}/.mcp.json (would change)" in out.stdout
    as_json = run_cli(
        cli_env,
        "setup",
        "claude-code",
        "--as",
        "worker",
        "--dir",
        str(tmp_path),
        "--print",
        "--json",
        *COMMAND,
    )
    files = {
        Path(f["path"]).name: json.loads(f["content"]) for f in json.loads(as_json.stdout)["files"]
    }
    server = files[".mcp.json"]["mcpServers"]["crossintercom"]
    assert server["command"] == "crossintercom"
    assert server["args"] == ["mcp", "--as", "worker"]
    assert server["env"]["CROSSINTERCOM_HOME"] == cli_env["CROSSINTERCOM_HOME"]
    assert "CROSSINTERCOM_STORE" not in server["env"]  # may hold a password; relays only
    (stop,) = files["settings.local.json"]["hooks"]["Stop"]
    (cmd,) = stop["hooks"]
    assert cmd["asyncRewake"] is True and cmd["type"] == "command"
    assert "crossintercom wait --as worker --format claude-hook" in cmd["command"]
    assert cmd["timeout"] > 3600
    (start,) = files["settings.local.json"]["hooks"]["SessionStart"]
    (cmd,) = start["hooks"]
    assert "crossintercom wait --as worker --format claude-socket" in cmd["command"]
    assert "asyncRewake" not in cmd  # it returns at once, leaving the delivery child
    assert files["settings.local.json"]["enabledMcpjsonServers"] == ["crossintercom"]


def test_claude_code_keeps_user_entries_and_is_idempotent(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"docs": {"command": "d"}}}))
    (tmp_path / ".claude").mkdir()
    user_settings: dict[str, Any] = {
        "permissions": {"allow": ["Bash(ls)"]},
        "enabledMcpjsonServers": ["docs"],
        "hooks": {
            "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
            "SessionStart": [{"hooks": [{"type": "command", "command": "load-env"}]}],
            "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "g"}]}],
        },
    }
    settings = tmp_path / ".claude" / "settings.local.json"
    settings.write_text(json.dumps(user_settings))
    setup(cli_env, "claude-code", "--as", "worker", "--dir", str(tmp_path))
    first = {p: p.read_text() for p in (tmp_path / ".mcp.json", settings)}
    again = setup(cli_env, "claude-code", "--as", "worker", "--dir", str(tmp_path))
    assert "unchanged" in again.stdout and "wrote" not in again.stdout
    assert {p: p.read_text() for p in first} == first

    servers = json.loads((tmp_path / ".mcp.json").read_text())["mcpServers"]
    assert set(servers) == {"docs", "crossintercom"}
    data = json.loads(settings.read_text())
    # the user's rules kept, and the rule for every crossintercom tool added once
    assert data["permissions"] == {"allow": ["Bash(ls)", "mcp__crossintercom"]}
    assert data["hooks"]["PreToolUse"] == user_settings["hooks"]["PreToolUse"]
    assert data["enabledMcpjsonServers"] == ["docs", "crossintercom"]
    commands = [h["command"] for g in data["hooks"]["Stop"] for h in g["hooks"]]
    assert commands[0] == "notify-send done" and len(commands) == 2

    # another name replaces crossintercom's own entries, nothing else
    setup(cli_env, "claude-code", "--as", "reviewer", "--dir", str(tmp_path))
    data = json.loads(settings.read_text())
    for event, user in (("Stop", "notify-send done"), ("SessionStart", "load-env")):
        commands = [h["command"] for g in data["hooks"][event] for h in g["hooks"]]
        assert len(commands) == 2 and commands[0] == user and "--as reviewer" in commands[1]

    # --no-allow takes crossintercom's rule out again, and only it
    setup(cli_env, "claude-code", "--as", "reviewer", "--no-allow", "--dir", str(tmp_path))
    assert json.loads(settings.read_text())["permissions"] == user_settings["permissions"]


def test_codex_keeps_toml_comments_and_user_hooks(cli_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('# mine\nmodel = "o3"\n\n[mcp_servers.docs]\ncommand = "docs"  # keep\n')
    hooks = tmp_path / "hooks.json"
    hooks.write_text(
        json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x"}]}]}})
    )
    args = ("codex", "--as", "worker", "--supervisor", "lead@B", "--dir", str(tmp_path))
    first = setup(cli_env, *args)
    assert "open /hooks and trust" in first.stdout  # a new hook: the user must trust it
    before = (config.read_text(), hooks.read_text())
    again = setup(cli_env, *args)
    assert "trust" not in again.stdout  # the hook did not change: its trust holds
    assert (config.read_text(), hooks.read_text()) == before
    text = config.read_text()
    assert text.startswith('# mine\nmodel = "o3"') and 'command = "docs"  # keep' in text
    parsed = tomllib.loads(text)
    server = parsed["mcp_servers"]["crossintercom"]
    assert server["args"] == ["mcp", "--as", "worker", "--supervisor", "lead@B"]
    assert server["tool_timeout_sec"] > 600
    # Codex waits for the server before the first turn; settings set later are passed through
    assert server["required"] is True
    assert set(server.get("env", {})) | set(server.get("env_vars", [])) >= {
        "CROSSINTERCOM_HOME",
        "CROSSINTERCOM_HOST_ID",
        "CROSSINTERCOM_GROUP",
    }
    stop = json.loads(hooks.read_text())["hooks"]["Stop"]
    assert stop[0]["hooks"][0]["command"] == "x"
    assert "wait --as worker --format codex-hook" in stop[1]["hooks"][0]["command"]


def test_unparseable_user_files_are_left_alone(cli_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / ".mcp.json").write_text("{ // a comment\n}")
    out = run_cli(cli_env, "setup", "claude-code", "--dir", str(tmp_path), "--json", *COMMAND)
    assert out.returncode == 2
    assert "not plain JSON" in json.loads(out.stdout)["error"]["message"]
    assert (tmp_path / ".mcp.json").read_text() == "{ // a comment\n}"


def test_pi_keeps_user_servers_and_is_idempotent(cli_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / ".pi" / "mcp.json"
    config.parent.mkdir()
    user = {"autoEnableCodemode": False, "mcpServers": {"docs": {"url": "https://d/mcp"}}}
    config.write_text(json.dumps(user))
    args = ("pi", "--as", "worker", "--supervisor", "lead@B", "--dir", str(tmp_path))
    written = setup(cli_env, *args)
    assert "--approve" in written.stdout  # the trust Pi asks for is named
    extension = tmp_path / ".pi" / "extensions" / "crossintercom.ts"
    first = (config.read_text(), extension.read_text())
    again = setup(cli_env, *args)
    assert "unchanged" in again.stdout and "wrote" not in again.stdout
    assert (config.read_text(), extension.read_text()) == first

    data = json.loads(config.read_text())
    assert data["autoEnableCodemode"] is False
    assert data["mcpServers"]["docs"] == user["mcpServers"]["docs"]  # type: ignore[index]
    server = data["mcpServers"]["crossintercom"]
    assert server["command"] == "crossintercom"
    assert server["args"] == ["mcp", "--as", "worker", "--supervisor", "lead@B"]
    assert server["env"]["CROSSINTERCOM_HOME"] == cli_env["CROSSINTERCOM_HOME"]
    assert server["exposure"] == "direct" and server["timeout"] > 600
    source = extension.read_text()
    assert 'const NAME: string = "worker";' in source
    assert "sendMessage(" in source and "sendUserMessage" not in source

    # another name replaces crossintercom's own entries, nothing else
    setup(cli_env, "pi", "--as", "reviewer", "--dir", str(tmp_path))
    data = json.loads(config.read_text())
    assert set(data["mcpServers"]) == {"docs", "crossintercom"}
    assert data["mcpServers"]["crossintercom"]["args"] == ["mcp", "--as", "reviewer"]
    assert 'const NAME: string = "reviewer";' in extension.read_text()


def test_pi_leaves_a_file_it_cannot_merge_alone(cli_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / ".pi" / "mcp.json"
    config.parent.mkdir()
    for text in ('{"mcpServers": []}', "{ // mine\n}"):
        config.write_text(text)
        out = run_cli(cli_env, "setup", "pi", "--dir", str(tmp_path), "--json", *COMMAND)
        assert out.returncode == 2, out.stdout
        assert config.read_text() == text
    assert not (tmp_path / ".pi" / "extensions").exists()


def _setup_opencode(env: dict[str, str], project: Path) -> Path:
    out = run_cli(
        env,
        "setup",
        "opencode",
        "--as",
        "worker",
        "--dir",
        str(project),
        "--command",
        f"{sys.executable} -m crossintercom.cli.main",
    )
    assert out.returncode == 0, out.stderr
    return project / ".opencode" / "plugins" / "crossintercom.js"


def _drive(plugin: Path, driver: Path, body: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """A stand-in for OpenCode: node loads the plugin and runs ``body`` with its hooks."""
    driver.write_text(
        f"import {{ CrossintercomMail }} from {json.dumps(str(plugin))};\n"
        "const log = (x) => console.log(JSON.stringify(x));\n"
        "const client = { session: {\n"
        "  promptAsync: async (req) => { log({ promptAsync: req }); process.exit(0); },\n"
        "  prompt: async () => { log({ prompt: 'awaits the whole turn' }); process.exit(1); },\n"
        "} };\n"
        "const hooks = await CrossintercomMail({ client });\n" + body
    )
    return subprocess.Popen(
        ["node", str(driver)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def prompted(node: subprocess.Popen[str]) -> dict[str, Any]:
    """The ``promptAsync`` request a driven plugin made (the stand-in exits 0 at it)."""
    said, err = node.communicate(timeout=60)
    assert node.returncode == 0, (said, err)
    return dict(json.loads(said.strip().splitlines()[-1])["promptAsync"])


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the OpenCode plugin")
def test_opencode_plugin_starts_a_turn_on_new_mail(
    cli_env: dict[str, str], tmp_path: Path, runtime_home: Path
) -> None:
    config = tmp_path / "opencode.json"
    config.write_text(json.dumps({"$schema": "https://opencode.ai/config.json", "theme": "x"}))
    plugin = _setup_opencode(cli_env, tmp_path)
    data = json.loads(config.read_text())
    assert data["theme"] == "x"
    assert data["mcp"]["crossintercom"]["type"] == "local"
    assert data["mcp"]["crossintercom"]["command"][-3:] == ["mcp", "--as", "worker"]
    node = _drive(plugin, tmp_path / "drive.mjs", IDLE, cli_env)
    try:
        waiting(node, runtime_home)  # the plugin's `crossintercom wait` holds worker
        run_cli(cli_env, "send", "--as", "planner", "--to", "worker", "wake up, review #7")
        prompt = prompted(node)
    finally:
        if node.poll() is None:
            node.kill()
    assert prompt["path"] == {"id": "s1"}
    text = prompt["body"]["parts"][0]["text"]
    assert "from planner@testhost" in text and "wake up, review #7" in text


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the OpenCode plugin")
def test_opencode_plugin_waiter_ends_with_dispose_or_its_host_and_none_in_run(
    cli_env: dict[str, str], tmp_path: Path, runtime_home: Path
) -> None:
    plugin = _setup_opencode(cli_env, tmp_path)
    body = IDLE + "process.stdin.once('data', async () => { await hooks.dispose(); });\n"
    for end in ("dispose", "SIGKILL"):
        node = _drive(plugin, tmp_path / "drive.mjs", body, cli_env)
        try:
            waiting(node, runtime_home)
            waiter = _child_waiter(node.pid)
            if end == "dispose":  # OpenCode disposes its plugins when it shuts an instance down
                assert node.stdin is not None
                node.stdin.write("dispose\n")
                node.stdin.flush()
            else:  # no hook runs: the lifeline ends the waiter
                node.kill()
            wait_for(functools.partial(_gone, waiter), 10, f"the waiter to end ({end})")
            assert end == "SIGKILL" or node.poll() is None  # dispose stops it, not the host
        finally:
            if node.poll() is None:
                node.kill()
            node.communicate()

    # `opencode run PROMPT` ends after its answer: the plugin starts no waiter at all.
    run = tmp_path / "run.mjs"
    run.write_text(
        "process.argv.splice(2, process.argv.length - 2, 'run', 'say hi');\n"
        f"const {{ CrossintercomMail }} = await import({json.dumps(str(plugin))});\n"
        "const hooks = await CrossintercomMail({ client: {} });\n"
        f"{IDLE}console.log('idle reported');\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        ["node", str(run)], env=cli_env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0 and "idle reported" in done.stdout, done.stderr
    assert time.monotonic() - started < 10  # nothing held node open


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the OpenCode plugin")
def test_opencode_plugin_does_not_wait_for_a_subagent_session(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    plugin = _setup_opencode(cli_env, tmp_path)
    driver = tmp_path / "drive.mjs"
    driver.write_text(
        f"import {{ CrossintercomMail }} from {json.dumps(str(plugin))};\n"
        "const client = { session: { get: async ({ path }) =>\n"
        "  ({ data: { id: path.id, parentID: path.id === 'child' ? 's1' : undefined } }) } };\n"
        "const hooks = await CrossintercomMail({ client });\n"
        "const idle = (id) => hooks.event({ event: { type: 'session.idle',\n"
        "  properties: { sessionID: id } } });\n"
        "await idle('child');\n"
        "console.log('child idle handled');\n"
        "process.stdin.once('data', async () => { await idle('s1'); console.log('s1'); });\n"
    )
    node = subprocess.Popen(
        ["node", str(driver)],
        env=cli_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert node.stdout is not None and node.stdin is not None
        assert node.stdout.readline().strip() == "child idle handled"
        assert _children(node.pid) == []  # a waiter would be spawned before the handler returns
        node.stdin.write("parent idle\n")
        node.stdin.flush()
        assert node.stdout.readline().strip() == "s1"
        assert len(_children(node.pid)) == 1  # the parent's idle starts it
    finally:
        node.kill()
        node.communicate()


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    return not pid_alive(pid)


def _child_waiter(parent: int) -> int:
    def found() -> int | None:
        for pid in _children(parent):
            with contextlib.suppress(OSError):
                if b"wait" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                    return pid
        return None

    return int(wait_for(found, 10, "the plugin's waiter"))


def test_a_waiter_whose_harness_is_already_gone_ends_at_once(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """A plugin's waiter spawned just as its host quits starts with no harness to watch."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    env = {**cli_env, "CROSSINTERCOM_HARNESS_PID": str(gone.pid)}
    started = time.monotonic()
    done = run_cli(env, "wait", "--as", "worker", "--timeout", "600", timeout=60)
    assert done.returncode != 0 and done.stdout == ""
    assert time.monotonic() - started < 30
