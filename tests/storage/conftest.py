"""Fixtures for the store suite: a fresh SQLite file or a fresh Postgres database per test."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossintercom.storage import MailboxStore, migrate, open_store
from crossintercom.storage.blocking import run
from tests.archive_sync import SyncArchive

REPO = Path(__file__).resolve().parents[2]
# Plain `pytest` (not `python -m pytest`) does not put the checkout on sys.path.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.pgharness import (  # noqa: E402, F401  (fixtures are found by name)
    PgServer,
    pg_empty_url,
    pg_server,
    pg_template,
    pg_url,
)

WORKERS = Path(__file__).with_name("workers.py")


def run_python(*args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run the package's Python in a child process, as a user would from a checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CROSSINTERCOM_STORE", None)
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        **kw,
    )


def spawn_worker(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(WORKERS), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    migrate.upgrade(url)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.pg)])
def store_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def archive(store_url: str) -> Iterator[SyncArchive]:
    a = SyncArchive(store_url)
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def store(store_url: str) -> Iterator[MailboxStore]:
    s = run(open_store(store_url))
    yield s
    run(s.aclose())
