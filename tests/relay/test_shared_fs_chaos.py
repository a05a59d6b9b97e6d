"""`crossintercom chaos` on a FUSE mount (tests/fusemounts.py): every simulated host on the one
bindfs mount, whose locks exclude, and whose filesystem type makes the relays poll their
doorbells by themselves (tests/relay/test_shared_filesystems.py checks that choice)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator

import pytest

from tests.conftest import run_cli
from tests.fusemounts import SharedDir, shared_dir
from tests.procs import clean_env
from tests.relay.test_shared_filesystems import intact, url_through


@pytest.fixture
def one_mount() -> Iterator[SharedDir]:
    with shared_dir(1) as shared:
        yield shared


def test_chaos_on_a_fuse_mount_loses_and_duplicates_nothing(one_mount: SharedDir) -> None:
    """Every simulated host on the one mount (its locks exclude): the relays poll, chosen by
    themselves, through relay kills, pauses, takeovers and the rest."""
    url = url_through(one_mount.mounts[0])
    args = ["chaos", "--hosts", "2", "--duration", "12", "--seed", "5", "--json", "--store", url]
    tmp = one_mount.root / "tmp"
    tmp.mkdir()
    proc = run_cli(clean_env(TMPDIR=str(tmp)), *args, timeout=240)
    report = json.loads(proc.stdout)
    assert "error" not in report, (report, proc.stderr[-4000:])
    assert report["acknowledged"] > 0 and report["delivered"] > 0
    assert (report["lost"], report["duplicated"]) == (0, 0), report
    with sqlite3.connect(one_mount.backing / "mailbox.sqlite") as conn:
        assert intact(conn)
