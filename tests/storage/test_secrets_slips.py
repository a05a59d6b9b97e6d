"""Passwords stay hidden when a store URL is written carelessly: a slip in its scheme, a ","
in the password, an option libpq does not know; a password file that is not UTF-8 is a clear
error; and `db grant-host -v` never prints the role's password, not even in the traceback of a
statement the server refused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from crossintercom.errors import StoreURLError
from crossintercom.storage.roles import role_name
from crossintercom.storage.urls import mask_url, parse_store_url
from tests.conftest import make_env, run_cli
from tests.pgharness import PgServer
from tests.storage.conftest import run_python

SECRET = "S3cr3t-PW-zz9"


@pytest.mark.parametrize(
    ("raw", "masked"),
    [
        (f"postgresql:/u:{SECRET}@h/x", "postgresql:/u:***@h/x"),
        (f"postgresql//u:{SECRET}@h/x", "postgresql//u:***@h/x"),
        (f"u:{SECRET}@h/x", "u:***@h/x"),
        (f"host=h password = {SECRET} dbname=x", "host=h password = *** dbname=x"),
        (
            "postgresql://u@h:5432/x?application_name=a@b",
            "postgresql://u@h:5432/x?application_name=a@b",
        ),
    ],
)
def test_a_url_with_a_slip_is_shown_masked(raw: str, masked: str) -> None:
    assert mask_url(raw) == masked
    if not raw.startswith("postgresql://"):
        with pytest.raises(StoreURLError) as caught:
            parse_store_url(raw)
        assert SECRET not in str(caught.value)


def test_a_comma_in_the_password_is_no_host_list() -> None:
    parsed = parse_store_url(f"postgresql://u:a,{SECRET}@db.example:5432/x")
    assert parsed.url.password == f"a,{SECRET}"
    assert parsed.hosts == ["db.example:5432"]
    assert SECRET not in parsed.masked


def test_an_unknown_option_is_refused_up_front() -> None:
    with pytest.raises(StoreURLError, match="bogus") as caught:
        parse_store_url(f"postgresql://u:{SECRET}@h/x?bogus=1")
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql:/u:{SECRET}@127.0.0.1:1/x",
        f"postgresql://u:a,{SECRET}@127.0.0.1:1/x",
        f"postgresql://u:{SECRET}@127.0.0.1:1/x?bogus=1",
    ],
)
def test_commands_never_print_a_slipped_password(url: str, runtime_home: Path) -> None:
    env = make_env(runtime_home, "slips-host")
    status = run_cli({**env, "CROSSINTERCOM_STORE": url}, "status", "--json")
    assert SECRET not in status.stdout + status.stderr
    for args in (("db", "current"), ("db", "upgrade"), ("archive",)):
        proc = run_cli(env, *args, "--store", url)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, (args, out)
        assert SECRET not in out, (args, out)
        assert "Traceback" not in out, (args, out)


def test_a_password_file_that_is_not_utf8_is_a_clear_error(
    tmp_path: Path, runtime_home: Path
) -> None:
    bad = tmp_path / "store.password"
    bad.write_bytes(b"S3cr\xff\n")
    env = make_env(runtime_home, "slips-host")
    store = "postgresql://u@127.0.0.1:1/x"
    proc = run_cli(env, "db", "current", "--store", store, "--store-password-file", str(bad))
    assert proc.returncode == 1, proc.stderr
    assert "not UTF-8" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def unprivileged_admin(pg_server: PgServer, pg_url: str) -> Iterator[tuple[str, str]]:
    """A host's role made earlier by a superuser, and an admin role that may not change it."""
    dbname = str(make_url(pg_url).database)
    target = role_name("slips-host", dbname)
    admin = f"ci_adm_{uuid.uuid4().hex[:8]}"
    with pg_server.admin() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(target)))
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(admin)))
    try:
        yield admin, make_url(pg_url).set(username=admin).render_as_string(hide_password=False)
    finally:
        with pg_server.admin() as conn:
            for role in (target, admin):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.mark.pg
def test_grant_host_verbose_never_prints_the_role_password(
    unprivileged_admin: tuple[str, str],
) -> None:
    _admin, url = unprivileged_admin
    proc = run_python(
        "-m", "crossintercom", "-v", "db", "grant-host", "slips-host", "--store", url,
        "--password-stdin", input=SECRET + "\n",
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "permission denied" in out
    assert SECRET not in out
