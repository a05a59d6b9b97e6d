"""The project key of path reservations: one key for every way of naming a repository (a
real checkout's key: tests/client/test_project_key.py)."""

from __future__ import annotations

import pytest

from crossintercom.client.reservations import normalise_remote


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
