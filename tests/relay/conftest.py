"""Simulated hosts for the multi-host tests: the tools' harness (``crossintercom.tools.harness``)
with the tests' helpers on top. Each host is its own runtime dir, host id, broker and relay
process, all sharing one store (a SQLite file or a Postgres database).

Everything a test starts is stopped at teardown: relays get SIGTERM then SIGKILL, the broker
named in ``<home>/broker.pid`` and any other process whose environment names the host's home
are SIGKILLed, clients are closed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crossintercom.storage import migrate

REPO = Path(__file__).resolve().parents[2]
# Plain `pytest` (not `python -m pytest`) does not put the checkout on sys.path.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from crossintercom.tools import harness  # noqa: E402
from tests.conftest import (  # noqa: E402
    CLI,
    Listener,
    cli_json,
    pids_using_home,
    run_cli,
    wait_for,
)
from tests.pgharness import (  # noqa: E402, F401  (fixtures are found by name)
    PgServer,
    pg_empty_url,
    pg_server,
    pg_template,
    pg_url,
)
from tests.procs import clean_env  # noqa: E402

# Imported names the tests take from here (for mypy, imports are re-exported only when listed).
__all__ = ["CLI", "Listener", "wait_for"]


# The tests' heartbeat, shorter than the product's (lease_s / 3, 5 s): the tests that shorten
# lease_s on one host (takeovers, lapsed leases) need every host beating well inside it. A
# test of the product's own pace gives heartbeat_s itself (tests/relay/test_pg_connections.py).
TEST_TUNABLES: dict[str, float] = {"heartbeat_s": 1.5}


class Host(harness.SimHost):
    """One simulated machine (``harness.SimHost``), with CLI runs and printed output to check."""

    # Teardown need not wait for a graceful broker exit: nothing of it is checked afterwards.
    broker_stop_signal = signal.SIGKILL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.configure()

    def configure(self, **tunables: float) -> None:
        super().configure(**{**TEST_TUNABLES, **tunables})

    def listen(self, name: str, *extra: str, wait: bool = True) -> Listener:
        """`crossintercom listen --as NAME --json` here, by default until it is online."""
        lst = Listener(self.env, name, *extra, wait=False)
        self.listeners.append(lst)
        if wait:
            lst.wait_online()
        return lst

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """One `crossintercom` command in this host's environment; never raises on exit status."""
        return run_cli(self.env, *args, timeout=timeout)

    def cli_json(self, *args: str, expect_rc: int = 0, timeout: float = 60) -> Any:
        return cli_json(self.env, *args, expect_rc=expect_rc, timeout=timeout)

    def inbox(self, name: str) -> Counter[str]:
        """How many times each message id is in NAME's durable inbox (empty if it has none)."""
        with self.open_inbox(name) as inbox:
            return Counter(e.id for e in inbox.messages())

    def stop(self) -> None:
        super().stop()
        for pid in pids_using_home(self.home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class Cluster(harness.Cluster[Host]):
    """The simulated hosts of one test, over one store, under a short dir of their own."""

    def __init__(self, store_url: str) -> None:
        root = Path(tempfile.mkdtemp(prefix="cr-", dir="/tmp"))
        super().__init__(root, store_url, Host, base_env=clean_env())

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.root, ignore_errors=True)

    def worker_on_b(self, **config: dict[str, float]) -> tuple[Host, Host, Listener]:
        """Hosts A and B (``up``'s ``config``), a `listen` sink "worker" on B that A sees."""
        a, b = self.up("A", "B", **config)
        worker = b.listen("worker")
        a.wait_sees("worker", "B")
        return a, b, worker


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'mailbox.sqlite'}"
    migrate.upgrade(url)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.pg)])
def store_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_store" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def backend(store_url: str) -> str:
    return "postgres" if store_url.startswith("postgresql") else "sqlite"


@pytest.fixture
def cluster(store_url: str) -> Iterator[Cluster]:
    c = Cluster(store_url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def sqlite_cluster(sqlite_store: str) -> Iterator[Cluster]:
    """Hosts over a SQLite store only (attacks on the file itself)."""
    c = Cluster(sqlite_store)
    try:
        yield c
    finally:
        c.close()
