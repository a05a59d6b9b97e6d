"""A retention longer than a date can reach back (a careless "keep it forever", 10 000 years)
is refused by `archive on` on every backend, and one already in a store purges nothing instead
of killing every relay's archiver at its first purge."""

from __future__ import annotations

import json

import pytest

from tests.archive_sync import SyncArchive
from tests.conftest import run_cli


@pytest.mark.parametrize("retention", ["3650000d", "100000w", "24856d"])
def test_archive_on_refuses_a_retention_no_store_can_hold(
    store_url: str, cli_env: dict[str, str], retention: str
) -> None:
    out = run_cli(
        cli_env, "--json", "archive", "on", "--retention", retention, "--store", store_url
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "invalid_argument"
    status = run_cli(cli_env, "--json", "archive", "status", "--store", store_url)
    assert json.loads(status.stdout) == {"enabled": False, "retention_s": 30 * 86400}


def test_a_retention_beyond_year_one_purges_nothing(sqlite_url: str) -> None:
    archive = SyncArchive(sqlite_url)
    try:
        archive.set_archive(enabled=True, retention_s=3_650_000 * 86400)
        assert archive.purge_archive() == 0
    finally:
        archive.close()
