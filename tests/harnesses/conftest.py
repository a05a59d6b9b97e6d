"""Fixtures for the real-harness tests (docs/agents.md, "Tested against").

- ``mock_model``: a started ``MockModel`` (mockmodel.py), stopped after the test; a responder
  that raised fails the test at teardown.
- ``harness_env``: a ``HarnessEnv``: an isolated HOME, XDG dirs, project dir and crossintercom
  runtime dir (``runtime_home`` from tests/conftest.py, host id ``testhost``) and the
  environment to run a harness in (no provider key, config or CROSSINTERCOM_* inherited; Node 22
  and this checkout's ``crossintercom`` first in PATH). ``leftovers()`` lists every process
  still running that was started for this test; teardown SIGKILLs them, so a failing test never
  leaks a harness or its children into the next.
- ``require_harness(name)`` (isolation.py): the argv prefix of a pinned harness (install.py),
  installing it if needed; skips with the reason when npm/node are missing, fails instead when
  ``CROSSINTERCOM_REQUIRE_HARNESSES=1`` (as CI sets it). kits.py calls it.

Every test in this directory carries the ``harness`` marker (``-m "not harness"`` leaves them
out). Point a harness at the mock with kits.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harnesses import install
from tests.harnesses.isolation import HarnessEnv, base_env
from tests.harnesses.mockmodel import MockModel

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.harness)


@pytest.fixture
def harness_env(runtime_home: Path, tmp_path: Path) -> Iterator[HarnessEnv]:
    henv = HarnessEnv(root=tmp_path, runtime=runtime_home)
    for d in (henv.home, henv.work, henv.home / ".config", henv.home / ".local/share"):
        d.mkdir(parents=True, exist_ok=True)
    try:
        henv.env = install.with_node22(base_env(henv))
    except install.HarnessUnavailable:
        henv.env = base_env(henv)  # require_harness reports it when a test needs a harness
    try:
        yield henv
    finally:
        henv.kill_all()


@pytest.fixture
def mock_model() -> Iterator[MockModel]:
    model = MockModel().start()
    try:
        yield model
    finally:
        model.stop()
    if model.errors:
        raise AssertionError(f"the mock model's responder raised: {model.errors!r}")
