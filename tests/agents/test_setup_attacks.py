"""`crossintercom setup` in a project it does not trust: links planted where it writes, user
files it cannot merge and values that would not survive into a harness's files. Setup writes
inside the directory it is given only, never through a link, and refuses what it cannot merge
with a clear error (exit 2), leaving every file as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from crossintercom.agents.handover.mail import HANDOVER_BYTES
from crossintercom.client import Client, Identity
from tests.agents.conftest import waiting
from tests.agents.test_setup import IDLE, _setup_opencode
from tests.conftest import run_cli, settings_for

COMMAND = ["--command", "crossintercom"]


def _run(env: dict[str, str], project: Path, harness: str, *args: str) -> tuple[int, str, str]:
    out = run_cli(env, "setup", harness, "--as", "worker", "--dir", str(project), *COMMAND, *args)
    return out.returncode, out.stdout, out.stderr


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.readlink().as_posix() if p.is_symlink() else p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_symlink() or p.is_file()
    }


def test_a_link_planted_at_the_temporary_name_is_never_written_through(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    project = tmp_path / "project"
    (project / ".claude").mkdir(parents=True)
    (project / "..mcp.json.crossintercom-tmp").symlink_to(victim)
    (project / ".claude" / ".settings.local.json.crossintercom-tmp").symlink_to(victim)
    rc, _, err = _run(cli_env, project, "claude-code")
    assert rc == 0, err
    assert victim.read_text() == "precious\n"
    mcp, settings = project / ".mcp.json", project / ".claude" / "settings.local.json"
    assert not mcp.is_symlink() and not settings.is_symlink()
    assert "crossintercom" in json.loads(mcp.read_text())["mcpServers"]
    assert json.loads(settings.read_text())["enabledMcpjsonServers"] == ["crossintercom"]
    planted = sorted(project.rglob("*crossintercom-tmp"))  # only the links, left as found
    assert [p.name for p in planted] == [
        "..mcp.json.crossintercom-tmp",
        ".settings.local.json.crossintercom-tmp",
    ]
    assert all(p.readlink() == victim for p in planted)


@pytest.mark.parametrize(
    ("harness", "link", "target_is_dir"),
    [
        ("claude-code", ".claude", True),
        ("claude-code", ".mcp.json", False),
        ("opencode", ".opencode/plugins", True),
        ("pi", ".pi", True),
        ("pi", ".pi/extensions/crossintercom.ts", False),
    ],
)
def test_links_in_the_project_are_never_followed_out_of_it(
    cli_env: dict[str, str], tmp_path: Path, harness: str, link: str, target_is_dir: bool
) -> None:
    outside = tmp_path / "outside"
    if target_is_dir:
        outside.mkdir()
    else:
        outside.write_text("{}\n")
    project = tmp_path / "project"
    (project / link).parent.mkdir(parents=True, exist_ok=True)
    (project / link).symlink_to(outside)
    before = _files(tmp_path)
    rc, out, err = _run(cli_env, project, harness, "--json")
    assert rc == 2, err
    error = json.loads(out)["error"]
    assert error["code"] == "invalid_argument"
    assert "symbolic link" in error["message"]
    assert _files(tmp_path) == before  # nothing written, the link itself kept
    # --print still shows what to add by hand
    rc, out, err = _run(cli_env, project, harness, "--print")
    assert rc == 0, err
    assert _files(tmp_path) == before


HOSTILE = [
    ("claude-code", ".mcp.json", '{"mcpServers": []}'),
    ("claude-code", ".mcp.json", '{"mcpServers": "x"}'),
    ("claude-code", ".claude/settings.local.json", '{"hooks": {"Stop": 5}}'),
    ("claude-code", ".claude/settings.local.json", '{"hooks": {"Stop": {"mine": 1}}}'),
    ("claude-code", ".claude/settings.local.json", '{"enabledMcpjsonServers": "abc"}'),
    ("claude-code", ".claude/settings.local.json", '{"permissions": {"allow": "Bash(ls)"}}'),
    ("claude-code", ".claude/settings.local.json", '{"permissions": {"allow": 5}}'),
    ("claude-code", ".mcp.json", "[" * 100_000),
    ("claude-code", ".mcp.json", b'{"a": "\xff"}'),
    ("opencode", "opencode.json", '{"mcp": []}'),
    ("opencode", ".opencode/plugins/crossintercom.js", b"\xff\xfe"),
    ("codex", "config.toml", "mcp_servers = 1\n"),
    ("codex", "config.toml", b"\xff"),
    ("codex", "hooks.json", '{"hooks": {"Stop": "x"}}'),
]


@pytest.mark.parametrize(("harness", "name", "content"), HOSTILE)
def test_a_file_setup_cannot_merge_is_left_alone_with_a_clear_error(
    cli_env: dict[str, str], tmp_path: Path, harness: str, name: str, content: str | bytes
) -> None:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = content.encode() if isinstance(content, str) else content
    path.write_bytes(raw)
    before = sorted(tmp_path.rglob("*"))
    rc, out, err = _run(cli_env, tmp_path, harness, "--json")
    assert "Traceback" not in err
    assert rc == 2, err
    assert json.loads(out)["error"]["code"] == "invalid_argument"
    assert path.read_bytes() == raw
    assert sorted(tmp_path.rglob("*")) == before  # no other file, no temporary left behind


def test_a_directory_where_a_file_goes_is_a_clear_error(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / ".claude" / "settings.local.json").mkdir(parents=True)
    rc, out, err = _run(cli_env, tmp_path, "claude-code", "--json")
    assert rc == 2, err
    assert "not a regular file" in json.loads(out)["error"]["message"]
    assert not (tmp_path / ".mcp.json").exists()


def test_an_escaped_lone_surrogate_in_a_user_file_is_kept(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / ".mcp.json").write_text('{"mine": "\\ud800"}')
    rc, _, err = _run(cli_env, tmp_path, "claude-code")
    assert rc == 0, err
    data = json.loads((tmp_path / ".mcp.json").read_text())
    assert data["mine"] == "\ud800" and "crossintercom" in data["mcpServers"]
    assert not list(tmp_path.glob("*crossintercom-tmp"))


def test_a_setting_that_is_not_utf8_is_refused(cli_env: dict[str, str], tmp_path: Path) -> None:
    env = {**cli_env, "CROSSINTERCOM_HOME": cli_env["CROSSINTERCOM_HOME"] + "\udcff"}
    rc, out, err = _run(env, tmp_path, "claude-code", "--json")
    assert "Traceback" not in err
    assert rc == 2, err
    assert "CROSSINTERCOM_HOME" in json.loads(out)["error"]["message"]
    assert list(tmp_path.iterdir()) == []


def test_placeholder_words_in_values_reach_the_plugin_as_given(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    home = str(tmp_path / "__WAIT_S__")
    env = {**cli_env, "CROSSINTERCOM_HOME": home}
    out = run_cli(
        env, "setup", "pi", "--as", "worker", "--dir", str(tmp_path), "--command", "ci __NAME__"
    )
    assert out.returncode == 0, out.stderr
    source = (tmp_path / ".pi" / "extensions" / "crossintercom.ts").read_text()
    assert f'"CROSSINTERCOM_HOME": {json.dumps(home)}' in source
    assert 'const COMMAND: string[] = ["ci", "__NAME__"];' in source


@pytest.mark.parametrize(
    "args",
    [("--command", " "), ("--command", "'unclosed"), ("--supervisor", "lead\udcff@B")],
)
def test_a_command_or_supervisor_it_cannot_write_is_refused(
    cli_env: dict[str, str], tmp_path: Path, args: tuple[str, str]
) -> None:
    out = run_cli(cli_env, "setup", "pi", "--as", "worker", "--dir", str(tmp_path), *args)
    assert "Traceback" not in out.stderr
    assert out.returncode == 2, out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the OpenCode plugin")
def test_opencode_plugin_hands_over_long_mail_intact(
    cli_env: dict[str, str], tmp_path: Path, runtime_home: Path
) -> None:
    """A hand-over of four-byte characters: one split between two pipe reads is kept whole
    (the hand-over is at most 24,000 bytes, which a pipe may still deliver in pieces)."""
    plugin = _setup_opencode(cli_env, tmp_path)
    got = tmp_path / "prompt.txt"
    driver = tmp_path / "drive.mjs"
    driver.write_text(
        'import { writeFileSync } from "node:fs";\n'
        f"import {{ CrossintercomMail }} from {json.dumps(str(plugin))};\n"
        "const client = { session: { promptAsync: async (req) => {\n"
        f"  writeFileSync({json.dumps(str(got))}, req.body.parts[0].text); process.exit(0);\n"
        "} } };\n"
        "const hooks = await CrossintercomMail({ client });\n" + IDLE
    )
    node = subprocess.Popen(["node", str(driver)], env=cli_env, stdout=subprocess.PIPE, text=True)
    text = "\U0001f600" * 16_000  # four bytes each: reads end inside characters
    try:
        waiting(node, runtime_home)
        settings = settings_for(cli_env)
        with Client(settings, Identity.named(settings, "planner")) as planner:
            for _ in range(4):  # one burst: the first hand-over is as long as one can be
                assert planner.send("worker", text).outcome.value == "delivered"
        assert node.wait(timeout=60) == 0
    finally:
        if node.poll() is None:
            node.kill()
        node.communicate()
    shown = got.read_text()
    assert "\U0001f600" * 4000 in shown and "\ufffd" not in shown
    assert len(shown.encode()) <= HANDOVER_BYTES
