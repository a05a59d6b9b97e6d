"""The project key of path reservations: one key for every way of naming a repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from crossintercom.client.reservations import normalise_remote, project_key, repo_paths
from crossintercom.errors import UsageError


@pytest.mark.parametrize(
    "url",
    [
        "git@github.com:Org/Repo.git",
        "ssh://git@GitHub.com:22/Org/Repo.git/",
        "https://github.com/Org/Repo",
        "https://user:token@github.com/Org/Repo.git",
        "git://github.com/Org/Repo.git",
    ],
)
def test_ssh_and_https_remotes_of_one_repository_match(url: str) -> None:
    assert normalise_remote(url) == "github.com/Org/Repo"


def test_local_remotes_stay_paths() -> None:
    assert normalise_remote("/srv/git/app.git") == "/srv/git/app"
    assert normalise_remote("file:///srv/git/app.git/") == "/srv/git/app"


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
