"""Each pinned harness, without crossintercom, runs one-shot against the mock model: it gets the
scripted answer, exits 0, and the mock logged the request that carried the prompt. The proof
that kits.py points every harness at the mock, offline (docs/agents.md, "Tested against")."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.conftest import wait_for
from tests.harnesses import kits
from tests.harnesses.isolation import HarnessEnv
from tests.harnesses.mockmodel import MockModel, Reply, Request

ANSWER = "MOCK-ANSWER-7f3c"
PROMPT = "baseline prompt 51e2"
# What each harness's one-shot run uses on the wire (kits.py).
API = {"claude": "anthropic", "codex": "responses", "opencode": "chat", "pi": "anthropic"}


@pytest.mark.parametrize("name", sorted(kits.KITS))
def test_one_shot_gets_the_scripted_answer(
    name: str, mock_model: MockModel, harness_env: HarnessEnv
) -> None:
    kit = kits.make(name, mock_model, harness_env)

    def script(req: Request) -> Reply:
        # Side requests (OpenCode's title) see the prompt too, but no tools.
        turn = PROMPT in req.all_text() and req.tool_names
        return Reply.say(ANSWER if turn else "side answer")

    mock_model.responder = script
    started = time.monotonic()
    done = kit.run(PROMPT)
    took = time.monotonic() - started

    assert done.returncode == 0, (done.stdout, done.stderr)
    assert ANSWER in done.stdout, (done.stdout, done.stderr)
    turn = mock_model.wait_for(lambda r: PROMPT in r.all_text() and r.tool_names, timeout=1)
    assert turn.api == API[name]
    assert took < 90, f"{name} took {took:.1f}s"
    harness_env.wait_all_gone(timeout=10)


def test_leftovers_finds_what_a_test_started(harness_env: HarnessEnv) -> None:
    """By the marker, and by HOME alone for a child whose environment was filtered."""
    home = str(harness_env.home)
    shell = f"sleep 60 & env -i HOME={home} sleep 60 & wait"
    proc = subprocess.Popen(["sh", "-c", shell], env=harness_env.env)
    try:
        found = wait_for(lambda: len(harness_env.leftovers()) == 3, 10, "three processes")
        assert proc.pid in harness_env.leftovers(), found
        assert len(harness_env.kill_all()) == 3
        harness_env.wait_all_gone()
    finally:
        proc.kill()
        proc.wait()
