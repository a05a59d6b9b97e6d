"""The project key and paths of path reservations read from a real git checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from crossintercom.client.reservations import project_key, repo_paths
from crossintercom.errors import UsageError


def test_project_key_and_paths_from_a_checkout(tmp_path: Path) -> None:
    repo = tmp_path / "app"
    (repo / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert project_key(cwd=repo / "src") == "app"  # no origin: the top directory's name
    subprocess.run(
        ["git", "-C", str(repo), "remote", "add", "origin", "git@example.org:t/app.git"],
        check=True,
    )
    assert project_key(cwd=repo) == "example.org/t/app"
    assert project_key(" mine ", cwd=repo) == "mine"
    assert repo_paths(["x.py", "../README"], cwd=repo / "src") == ["src/x.py", "README"]
    with pytest.raises(UsageError):
        repo_paths(["../../elsewhere"], cwd=repo)
    with pytest.raises(UsageError, match="--project"):
        project_key(cwd=tmp_path)
