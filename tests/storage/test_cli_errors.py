"""`crossintercom db` as a user meets it: creating schemas, and one clear line per mistake."""

from __future__ import annotations

import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from crossintercom.cli.db import db
from crossintercom.errors import StoreError, StoreReadOnly, StoreUnavailable, StoreURLError
from crossintercom.storage import mask_url, migrate, open_store
from crossintercom.storage.blocking import open_blocking_store, run
from tests.pgharness import PgServer
from tests.storage.conftest import run_python

HEAD = migrate.head_revision()

SECRET = "s3cr3t-Pa55"
HEAD = migrate.head_revision()


def db_cli(*args: str) -> tuple[int, str, str]:
    proc = run_python("-m", "crossintercom.cli.db", *args)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_clear_line(stderr: str, *needles: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    assert SECRET not in stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_mask_url_hides_passwords() -> None:
    assert mask_url(f"postgresql://u:{SECRET}@h:5/db") == "postgresql://u:***@h:5/db"
    assert (
        mask_url(f"postgresql://h/db?password={SECRET}&x=1") == "postgresql://h/db?password=***&x=1"
    )
    assert mask_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_upgrade_and_current_on_a_fresh_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    code, out, err = db_cli("current", "--store", url)
    assert (code, err) == (0, "") and "no schema" in out
    code, out, err = db_cli("upgrade", "--store", url)
    assert code == 0, err
    assert HEAD in out and "(head)" in out
    code, out, _ = db_cli("current", "--store", url)
    assert out.strip() == f"{HEAD} (head)"
    open_blocking_store(url).close()


def test_cli_runner_and_env_default(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'env.db'}"
    result = CliRunner().invoke(db, ["upgrade"], env={"CROSSINTERCOM_STORE": url})
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(db, ["current"], env={"CROSSINTERCOM_STORE": url})
    assert result.output.strip() == f"{HEAD} (head)"
    # Errors surface as StoreError for the root command to print.
    result = CliRunner().invoke(db, ["current", "--store", "mysql://x/y"])
    assert isinstance(result.exception, StoreURLError)
    result = CliRunner().invoke(db, ["upgrade"], env={"CROSSINTERCOM_STORE": ""})
    assert result.exit_code == 2 and "--store" in result.output


@pytest.mark.pg
def test_upgrade_a_fresh_postgres_database(pg_empty_url: str) -> None:
    code, out, err = db_cli("upgrade", "--store", pg_empty_url)
    assert code == 0, err
    assert "(head)" in out
    code, out, _ = db_cli("current", "--store", pg_empty_url)
    assert out.strip() == f"{HEAD} (head)"


def test_usage_error_without_a_store() -> None:
    code, _, err = db_cli("upgrade")
    assert code == 2
    assert "CROSSINTERCOM_STORE" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        (f"mysql://root:{SECRET}@db/x", ["unsupported store URL scheme", "***"]),
        ("sqlite://", ["names no file"]),
        (f"postgresql://u:{SECRET}@127.0.0.1:1/x", ["cannot reach", "u:***@", "host and port"]),
        ("sqlite:////nonexistent-dir/sub/x.db", ["does not exist", "/nonexistent-dir/sub"]),
    ],
)
def test_bad_urls_read_as_one_line(url: str, needles: list[str]) -> None:
    for command in ("upgrade", "current"):
        code, out, err = db_cli(command, "--store", url)
        assert code == 1, (out, err)
        assert_one_clear_line(err, *needles)


def test_missing_schema_says_what_to_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'absent.db'}"
    code = (
        "from crossintercom.storage.blocking import open_blocking_store; "
        f"open_blocking_store({url!r})"
    )
    proc = run_python("-c", code)
    assert "SchemaMissing" in proc.stderr and "crossintercom db upgrade --store" in proc.stderr
    assert not (tmp_path / "absent.db").exists()  # opening never creates an empty file


def test_read_only_sqlite_file_and_directory(tmp_path: Path) -> None:
    ro_dir = tmp_path / "ro"
    ro_dir.mkdir()
    url = f"sqlite:///{ro_dir / 'store.db'}"
    assert db_cli("upgrade", "--store", url)[0] == 0

    (ro_dir / "store.db").chmod(0o444)
    with pytest.raises(StoreReadOnly, match="read-only"):
        run(open_store(url))
    code, _, err = db_cli("upgrade", "--store", url)
    assert code == 1
    assert_one_clear_line(err, "read-only", "chmod")

    (ro_dir / "store.db").chmod(0o644)
    ro_dir.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(StoreReadOnly, match="directory"):
            run(open_store(url))
        code, _, err = db_cli("upgrade", "--store", url)
        assert code == 1
        assert_one_clear_line(err, "directory", "read-only")
    finally:
        ro_dir.chmod(0o755)


@pytest.fixture
def role_with_password(pg_server: PgServer, pg_url: str) -> Iterator[str]:
    role = f"ci_role_{uuid.uuid4().hex[:8]}"
    with pg_server.admin() as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(SECRET)
            )
        )
    yield role
    with pg_server.admin() as admin:
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.mark.pg
def test_wrong_credentials_and_missing_database(
    pg_server: PgServer, pg_url: str, role_with_password: str
) -> None:
    from sqlalchemy.engine import make_url

    good = make_url(pg_url)
    url = good.set(username=role_with_password, password=SECRET + "-wrong").render_as_string(
        hide_password=False
    )
    try:
        psycopg.connect(url.replace("+psycopg", ""), connect_timeout=3).close()
        # Trust authentication (usual on test servers) ignores passwords; a role that does
        # not exist is then the credential a server can still refuse.
        url = good.set(username=f"{role_with_password}_nobody", password=SECRET).render_as_string(
            hide_password=False
        )
    except psycopg.OperationalError:
        pass
    code, _, err = db_cli("upgrade", "--store", url)
    assert code == 1
    assert_one_clear_line(err, "cannot reach", "***", "user name and password")
    with pytest.raises(StoreUnavailable) as info:
        run(open_store(url))
    assert SECRET not in str(info.value)

    missing = good.set(database="ci_no_such_db").render_as_string(hide_password=False)
    code, _, err = db_cli("current", "--store", missing)
    assert code == 1
    assert_one_clear_line(err, "ci_no_such_db", "does not exist")


@pytest.mark.pg
def test_missing_schema_on_postgres(pg_empty_url: str) -> None:
    with pytest.raises(StoreError, match="crossintercom db upgrade --store"):
        run(open_store(pg_empty_url))
