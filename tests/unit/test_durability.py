"""The durability setting (docs/operations.md): config.json, environment, and what it sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crossintercom.config import ENV_DURABILITY, ENV_HOME, load_settings
from crossintercom.errors import ConfigError
from crossintercom.inbox import Inbox
from crossintercom.local_broker.state.store import BrokerState

# PRAGMA synchronous reads back as a number. The inbox keeps a rollback journal (no -shm
# mapping, docs/operations.md#bounded-files), where OFF is what survives a process crash.
LEVELS = {"normal": 1, "full": 2}
INBOX_LEVELS = {"normal": 0, "full": 2}


def test_default_is_normal(tmp_path: Path) -> None:
    s = load_settings({ENV_HOME: str(tmp_path)})
    assert (s.durability, s.sqlite_synchronous) == ("normal", "NORMAL")


def test_config_file_then_environment(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"durability": "full"}))
    assert load_settings({ENV_HOME: str(tmp_path)}).sqlite_synchronous == "FULL"
    env = {ENV_HOME: str(tmp_path), ENV_DURABILITY: "normal"}
    assert load_settings(env).sqlite_synchronous == "NORMAL"


@pytest.mark.parametrize("bad", ["off", "FULL", "extra"])
def test_bad_value_refused_readably(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid durability .*'normal' or 'full'"):
        load_settings({ENV_HOME: str(tmp_path), ENV_DURABILITY: bad})


def test_bad_type_in_config_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"durability": 2}))
    with pytest.raises(ConfigError, match="'durability' must be a string"):
        load_settings({ENV_HOME: str(tmp_path)})


@pytest.mark.parametrize("level", ["normal", "full"])
def test_inbox_and_broker_state_use_it(tmp_path: Path, level: str) -> None:
    s = load_settings({ENV_HOME: str(tmp_path), ENV_DURABILITY: level})
    with Inbox.of(s, "sid") as box:
        assert box._db.execute("PRAGMA synchronous").fetchone()[0] == INBOX_LEVELS[level]
    state = BrokerState(tmp_path, synchronous=s.sqlite_synchronous)
    try:
        assert state._db.execute("PRAGMA synchronous").fetchone()[0] == LEVELS[level]
    finally:
        state.close()
