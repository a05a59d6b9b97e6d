"""How to point each real harness at the mock model: offline, non-interactive, no telemetry,
update checks, login or trust prompts.

Use::

    kit = kits.make("codex", mock_model, harness_env)   # writes the harness's config files
    done = kit.run("say hi")            # one-shot run (``claude -p``, ``codex exec``,
                                        # ``opencode run``, ``pi --print``), CompletedProcess
    proc = kit.start(*kit.one_shot_args("say hi"))      # the same in the background
    proc = kit.start()                  # the bare command (add your own arguments)

``kit.env`` is the environment to run the harness (and ``crossintercom setup``) with;
``kit.config`` the file the kit wrote (``crossintercom setup`` later adds its entries to the
same user-level files, keeping the kit's). Per harness:

- Claude Code: ``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY`` plus ``DISABLE_*`` variables;
  ``~/.claude.json`` marks onboarding done, the project trusted and the key approved. Tool
  search is off (``ENABLE_TOOL_SEARCH=false``) so MCP tools are offered directly instead of
  behind a ``ToolSearch`` call the mock would have to script.
- Codex: ``$CODEX_HOME/config.toml`` with a ``mock`` model provider (``wire_api =
  "responses"``, key from ``MOCK_API_KEY``), ``approval_policy = "never"``, full access sandbox,
  the project trusted, analytics and feedback off.
- OpenCode: ``$XDG_CONFIG_HOME/opencode/opencode.json`` with a ``mock`` provider through the
  openai-compatible SDK (Chat Completions), autoupdate and sharing off, models.dev not fetched,
  the config dir marked as already holding ``@opencode-ai/plugin`` (no registry fetch).
- Pi: ``~/.pi/agent/models.json`` with a ``mock`` provider (``anthropic-messages``),
  ``settings.json`` making it the default, ``PI_OFFLINE``. Pi runs under Node 22 (install.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.harnesses.isolation import HarnessEnv, require_harness
from tests.harnesses.mockmodel import MockModel

__all__ = ["KITS", "MOCK_KEY", "Kit", "make"]

MOCK_KEY = "sk-mock-key-for-tests-0000"
MODEL = "mock-model"
RUN_TIMEOUT = 120


@dataclass
class Kit:
    name: str
    argv: list[str]  # the harness command, without arguments
    env: dict[str, str]
    cwd: Path
    config: Path
    one_shot: Callable[[str], list[str]] = field(repr=False)

    def one_shot_args(self, prompt: str) -> list[str]:
        """The arguments of a one-shot, non-interactive run of ``prompt``."""
        return self.one_shot(prompt)

    def run(
        self, prompt: str, *extra: str, timeout: float = RUN_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """Run ``prompt`` one-shot to the end (stdin closed); never raises on exit status."""
        return subprocess.run(
            [*self.argv, *self.one_shot(prompt), *extra],
            env={**self.env, "PWD": str(self.cwd)},
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, *args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen[str]:
        """The harness with ``args`` in the background, its output piped."""
        return subprocess.Popen(
            [*self.argv, *args],
            env={**self.env, "PWD": str(self.cwd)},
            cwd=self.cwd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def _write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def claude(mock: MockModel, henv: HarnessEnv) -> Kit:
    env = {
        **henv.env,
        "ANTHROPIC_BASE_URL": mock.base_url,
        "ANTHROPIC_API_KEY": MOCK_KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "ENABLE_TOOL_SEARCH": "false",
        # Tests run as root; Claude Code refuses to skip permission prompts as root elsewhere.
        "IS_SANDBOX": "1",
    }
    state = {
        "hasCompletedOnboarding": True,
        "theme": "dark",
        "bypassPermissionsModeAccepted": True,
        "customApiKeyResponses": {"approved": [MOCK_KEY[-20:]], "rejected": []},
        "projects": {
            str(henv.work): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}
        },
    }
    config = _write_json(henv.home / ".claude.json", state)
    return Kit("claude", require_harness("claude"), env, henv.work, config, lambda p: ["-p", p])


def codex(mock: MockModel, henv: HarnessEnv) -> Kit:
    codex_home = henv.home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    config = codex_home / "config.toml"
    config.write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "mock"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "check_for_update_on_startup = false\n"
        "\n[model_providers.mock]\n"
        'name = "mock"\n'
        f'base_url = "{mock.base_url}/v1"\n'
        'env_key = "MOCK_API_KEY"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
        "\n[analytics]\nenabled = false\n"
        "\n[feedback]\nenabled = false\n"
        f"\n[projects.{json.dumps(str(henv.work))}]\n"
        'trust_level = "trusted"\n'
    )
    env = {**henv.env, "CODEX_HOME": str(codex_home), "MOCK_API_KEY": MOCK_KEY}
    return Kit(
        "codex",
        require_harness("codex"),
        env,
        henv.work,
        config,
        lambda p: ["exec", "--skip-git-repo-check", p],
    )


def opencode(mock: MockModel, henv: HarnessEnv) -> Kit:
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Mock",
        "options": {"baseURL": f"{mock.base_url}/v1", "apiKey": MOCK_KEY},
        "models": {MODEL: {"name": "Mock", "tool_call": True}},
    }
    settings = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"mock": provider},
        "model": f"mock/{MODEL}",
        "small_model": f"mock/{MODEL}",
        "autoupdate": False,
        "share": "disabled",
    }
    config = _write_json(henv.home / ".config" / "opencode" / "opencode.json", settings)
    # OpenCode installs @opencode-ai/plugin into each config dir from the registry, in the
    # background, at every start; a lock naming it (and a node_modules dir) says it is there.
    # Seconds saved, no registry needed; the plugin crossintercom installs imports nothing.
    (config.parent / "node_modules").mkdir(exist_ok=True)
    lock = {"packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}}
    _write_json(config.parent / "package-lock.json", lock)
    env = {
        **henv.env,
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    return Kit(
        "opencode", require_harness("opencode"), env, henv.work, config, lambda p: ["run", p]
    )


def pi(mock: MockModel, henv: HarnessEnv) -> Kit:
    agent = henv.home / ".pi" / "agent"
    provider = {
        "baseUrl": mock.base_url,
        "api": "anthropic-messages",
        "apiKey": MOCK_KEY,
        "models": [{"id": MODEL, "name": "Mock"}],
    }
    config = _write_json(agent / "models.json", {"providers": {"mock": provider}})
    settings = {"defaultProvider": "mock", "defaultModel": MODEL, "quietStartup": True}
    _write_json(agent / "settings.json", settings)
    env = {**henv.env, "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}
    return Kit("pi", require_harness("pi"), env, henv.work, config, lambda p: ["--print", p])


KITS: dict[str, Callable[[MockModel, HarnessEnv], Kit]] = {
    "claude": claude,
    "codex": codex,
    "opencode": opencode,
    "pi": pi,
}


def make(name: str, mock: MockModel, henv: HarnessEnv) -> Kit:
    """The kit for harness ``name`` ("claude", "codex", "opencode", "pi"), config written."""
    return KITS[name](mock, henv)
