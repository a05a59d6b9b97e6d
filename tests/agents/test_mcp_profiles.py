"""Tool profiles: what each `crossintercom mcp --profile` offers, what its `tools/list` costs
(measured through the official SDK's client), and that a tool left out is refused with a code
and stays a CLI command (docs/agents.md#tool-profiles)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from crossintercom.agents.mcp.profiles import CORE, PROFILES
from tests.agents.conftest import mcp_server, online, until
from tests.conftest import run_cli

# The default profile's whole tools/list, in bytes of JSON: what every request carries.
CORE_BUDGET = 6000
# Each tool's CLI command (a tool left out of a profile is still the CLI's).
CLI = {
    "whoami": ["status"],
    "list_sessions": ["list"],
    "groups": ["groups"],
    "join": ["join"],
    "leave": ["leave"],
    "set_status": ["set-status"],
    "set_wake": ["set-wake"],
    "receipts": ["listen"],
    "ack": ["ack"],
    "acks": ["acks"],
    "dead_letters": ["dead-letters"],
    "resend": ["resend"],
    "inbound_policy": ["inbound"],
    "reserve": ["reserve"],
    "unreserve": ["unreserve"],
    "reservations": ["reservations"],
    "escalate_decision": ["escalate", "decision"],
    "escalate_interview": ["escalate", "interview"],
    "escalate_progress": ["escalate", "progress"],
    "answer_escalation": ["escalate", "answer"],
}


def test_each_profile_offers_its_tools_and_core_fits_the_budget(
    cli_env: dict[str, str], runtime_home: Path
) -> None:
    sizes = asyncio.run(_profiles(cli_env, runtime_home))
    assert sizes["core"] <= CORE_BUDGET, sizes
    assert sizes["core"] < sizes["supervisor"] < sizes["all"], sizes
    assert sizes["coord"] < sizes["all"], sizes


async def _profiles(env: dict[str, str], home: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    every: set[str] = set()
    for profile in PROFILES:
        async with mcp_server(env, "worker", "--profile", profile) as (worker, _):
            listed = await worker.session.list_tools()
            # The result as the server put it on the wire (aliases, nothing unset).
            sizes[profile] = len(listed.model_dump_json(by_alias=True, exclude_none=True))
            names = [t.name for t in listed.tools]
            assert len(names) == len(set(names)), names
            wanted = PROFILES[profile]
            if wanted is not None:
                assert set(names) == set(wanted), (profile, names)
            else:
                every = set(names)
            for tool in listed.tools:
                # One line each, no schema titles or null branches: bytes every turn pays for.
                assert tool.description and "\n" not in tool.description, tool.name
                schema = tool.input_schema
                assert "title" not in schema, tool.name
                for arg, prop in schema.get("properties", {}).items():
                    assert "title" not in prop and "'null'" not in str(prop), (tool.name, arg)
    assert len(every) == 25, every
    # Every tool outside core is still a CLI command.
    for tool in sorted(every - set(CORE)):
        out = run_cli(env, *CLI[tool], "--help")
        assert out.returncode == 0, (tool, out.stderr)
    # The server's default, with no --profile: core.
    async with mcp_server(env, "worker") as (worker, init):
        assert {t.name for t in (await worker.session.list_tools()).tools} == set(CORE)
        assert init.instructions is not None and "escalate" not in init.instructions
        await until(lambda: online(home, "worker"), 30, "the MCP server to hold worker")
        left_out = await worker.call("reserve", globs=["src/**"])
        text = str(left_out.content[0].text)
        assert left_out.is_error and left_out.structured_content["error"]["code"] == "unknown_tool"
        assert "not in the core profile (the CLI has it)" in text, text
    # A supervisor named: the escalation tools come with it.
    async with mcp_server(env, "worker", "--supervisor", "lead") as (worker, init):
        offered = {t.name for t in (await worker.session.list_tools()).tools}
        assert "escalate_decision" in offered and "reserve" not in offered, offered
        assert init.instructions is not None and "escalate_decision" in init.instructions
    return sizes


def test_setup_writes_the_profile_into_the_harness_entry(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    for harness, profile in (("claude-code", "coord"), ("codex", "all")):
        out = run_cli(
            cli_env,
            *("setup", harness, "--as", "worker", "--dir", str(tmp_path / harness)),
            *("--profile", profile, "--print", "--json"),
        )
        assert out.returncode == 0, out.stderr
        files = {f["path"]: f["content"] for f in json.loads(out.stdout)["files"]}
        entry = next(c for p, c in files.items() if p.endswith((".mcp.json", "config.toml")))
        assert profile in entry.split("--profile", 1)[1][:30], entry
