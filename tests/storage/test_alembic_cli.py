"""The ``alembic`` command line in a checkout, as a developer writing a migration runs it: the
root alembic.ini finds the scripts, the store comes from ``-x store=URL`` (or the environment,
or the ini), and autogenerate against a migrated store finds nothing to do, on both dialects.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossintercom.config import ENV_STORE
from crossintercom.storage import migrate
from tests.storage.conftest import REPO

ROOT_INI = REPO / "alembic.ini"
VERSIONS = REPO / "crossintercom" / "storage" / "migrations" / "versions"


def alembic(*args: str, ini: Path = ROOT_INI, store: str | None = None) -> tuple[int, str]:
    """Run the real ``alembic`` CLI from the checkout; returns (exit code, stdout + stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(ENV_STORE, None)
    if store is not None:
        env[ENV_STORE] = store
    proc = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def scratch_ini(tmp_path: Path) -> tuple[Path, Path]:
    """The root alembic.ini, written to ``tmp_path`` with ``tmp_path/versions`` as a second
    version location: ``alembic revision --version-path`` accepts only a configured location,
    and a generated file must never land in the package (a parallel test would see two heads).
    """
    scratch = tmp_path / "versions"
    scratch.mkdir()
    text = ROOT_INI.read_text().replace("%(here)s", REPO.as_posix())
    locations = f"version_locations = {VERSIONS}{os.pathsep}{scratch}\n"
    assert "[alembic]\n" in text and "path_separator = os\n" in text
    ini = tmp_path / "alembic.ini"
    ini.write_text(text.replace("[alembic]\n", f"[alembic]\n{locations}", 1))
    return ini, scratch


def operations(script: Path, function: str) -> list[ast.stmt]:
    """The statements of ``function`` in a revision script, less its docstring and ``pass``."""
    tree = ast.parse(script.read_text())
    [fn] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    return [
        s
        for s in fn.body
        if not isinstance(s, ast.Pass)
        and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.pg)])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'fresh.db'}"
    url: str = request.getfixturevalue("pg_empty_url")
    return url


def test_autogenerate_against_a_migrated_store_is_empty(fresh_url: str, tmp_path: Path) -> None:
    before = sorted(VERSIONS.iterdir())
    code, out = alembic("-x", f"store={fresh_url}", "upgrade", "head")
    assert code == 0, out
    code, out = alembic("-x", f"store={fresh_url}", "current")
    assert code == 0 and f"{migrate.head_revision()} (head)" in out, out

    # What docs/storage.md tells a developer to run first: nothing differs.
    code, out = alembic("-x", f"store={fresh_url}", "check")
    assert code == 0 and "No new upgrade operations detected" in out, out

    ini, scratch = scratch_ini(tmp_path)
    code, out = alembic(
        *("-x", f"store={fresh_url}", "revision", "--autogenerate", "-m", "x"),
        *("--rev-id", "9999", "--version-path", str(scratch)),
        ini=ini,
    )
    assert code == 0, out
    [script] = scratch.iterdir()
    assert operations(script, "upgrade") == [], script.read_text()
    assert operations(script, "downgrade") == [], script.read_text()
    assert f"down_revision: str | None = {migrate.head_revision()!r}" in script.read_text()
    assert sorted(VERSIONS.iterdir()) == before  # nothing written into the package


def test_the_store_comes_from_x_then_environment_then_ini(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    migrate.upgrade(url)
    missing = f"sqlite:///{tmp_path / 'nowhere' / 'x.db'}"

    code, out = alembic("-x", f"store={url}", "current", store=missing)
    assert code == 0 and "(head)" in out, out
    code, out = alembic("current", store=url)
    assert code == 0 and "(head)" in out, out
    ini = tmp_path / "alembic.ini"
    ini.write_text(
        ROOT_INI.read_text()
        .replace("%(here)s", REPO.as_posix())
        .replace("sqlalchemy.url =", f"sqlalchemy.url = {url}")
    )
    code, out = alembic("current", ini=ini)
    assert code == 0 and "(head)" in out, out

    code, out = alembic("current")
    assert code != 0
    assert "no store given: pass -x store=URL, set CROSSINTERCOM_STORE" in out
    assert "Traceback" not in out
    code, out = alembic("-x", f"store={missing}", "current")
    assert code != 0 and "does not exist" in out and "Traceback" not in out
