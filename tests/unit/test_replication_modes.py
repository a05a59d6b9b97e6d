"""What `db doctor` and `status` call each replication set-up (storage/replication.py)."""

from __future__ import annotations

import pytest

from crossintercom.storage.replication import classify


@pytest.mark.parametrize(
    ("names", "commit", "standbys", "sync", "hidden", "mode"),
    [
        ('"node_b"', "on", 1, 1, 0, "synchronous"),
        ("ANY 1 (a, b)", "remote_apply", 2, 2, 0, "synchronous"),
        ('"node_b"', "on", 0, 0, 0, "waiting"),
        ('"node_b"', "local", 1, 1, 0, "asynchronous"),
        ('"node_b"', "off", 1, 0, 0, "asynchronous"),
        ("", "on", 1, 0, 0, "asynchronous"),
        ("", "on", 0, 0, 0, "none"),
        ('"node_b"', "on", 1, 0, 1, "unknown"),
    ],
)
def test_modes(names: str, commit: str, standbys: int, sync: int, hidden: int, mode: str) -> None:
    found = classify(False, names, commit, standbys, sync, hidden)
    assert found.mode == mode
    assert found.says
