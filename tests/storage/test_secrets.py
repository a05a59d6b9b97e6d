"""Passwords never reach output: masking holds for passwords with "@" and ":" (written raw, as
a careless operator does), and `db current`, `db upgrade` and their errors never print one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from crossintercom.storage.urls import mask_url, parse_store_url
from tests.pgharness import PgServer
from tests.storage.conftest import run_python

TRICKY = "tr1cky@Pa55:w0rd"
FRAGMENTS = ("tr1cky", "Pa55", "w0rd")


def leaks(text: str) -> list[str]:
    return [f for f in FRAGMENTS if f in text]


@pytest.mark.parametrize(
    ("raw", "masked"),
    [
        (f"postgresql://u:{TRICKY}@db.example:5432/x", "postgresql://u:***@db.example:5432/x"),
        (f"postgresql+psycopg://u:{TRICKY}@h/x", "postgresql+psycopg://u:***@h/x"),
        ("postgresql://u:a:b:c@h/x", "postgresql://u:***@h/x"),
        ("postgresql://u:p%40ss@h/x", "postgresql://u:***@h/x"),
        (f"postgresql://u@h/x?password={TRICKY}", "postgresql://u@h/x?password=***"),
        ("postgresql://u@h/x", "postgresql://u@h/x"),
        ("sqlite:////tmp/a@b.sqlite", "sqlite:////tmp/a@b.sqlite"),
    ],
)
def test_mask_url_hides_the_whole_password(raw: str, masked: str) -> None:
    assert mask_url(raw) == masked


@pytest.mark.parametrize("password", [TRICKY, "a:b", "x@y@z", "p%40ss"])
def test_a_raw_password_means_what_was_written(password: str) -> None:
    parsed = parse_store_url(f"postgresql://u:{password}@db.example:5432/x")
    expected = "p@ss" if password == "p%40ss" else password
    assert parsed.url.password == expected
    assert parsed.url.host == "db.example"
    assert parsed.masked == "postgresql://u:***@db.example:5432/x"


@pytest.fixture
def tricky_role(pg_server: PgServer, pg_url: str) -> Iterator[str]:
    role = f"ci_trick_{uuid.uuid4().hex[:8]}"
    dbname = str(make_url(pg_url).database)
    with pg_server.admin() as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(TRICKY)
            )
        )
        admin.execute(
            sql.SQL("GRANT ALL ON DATABASE {} TO {}").format(
                sql.Identifier(dbname), sql.Identifier(role)
            )
        )
    with psycopg.connect(pg_server.url_for(dbname, driver="postgresql"), autocommit=True) as db:
        db.execute(
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(
                sql.Identifier(role)
            )
        )
    yield role
    with psycopg.connect(pg_server.url_for(dbname, driver="postgresql"), autocommit=True) as db:
        db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    with pg_server.admin() as admin:
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _raw_url(pg_url: str, role: str, database: str | None = None, port: int | None = None) -> str:
    url = make_url(pg_url)
    host, dbname = url.host or "127.0.0.1", database or url.database
    return f"postgresql://{role}:{TRICKY}@{host}:{port or url.port or 5432}/{dbname}"


@pytest.mark.pg
def test_db_commands_and_their_errors_never_print_the_password(
    pg_url: str, tricky_role: str
) -> None:
    good = _raw_url(pg_url, tricky_role)
    runs = {
        "current": run_python("-m", "crossintercom", "db", "current", "--store", good),
        "current --json": run_python(
            "-m", "crossintercom", "--json", "db", "current", "--store", good
        ),
        "no such database": run_python(
            "-m", "crossintercom", "db", "current", "--store", _raw_url(pg_url, tricky_role, "nx")
        ),
        "nothing listening": run_python(
            "-m",
            "crossintercom",
            "--json",
            "db",
            "upgrade",
            "--store",
            _raw_url(pg_url, tricky_role, port=1),
        ),
        "bad scheme": run_python(
            "-m", "crossintercom", "db", "current", "--store", good.replace("postgresql", "pg2")
        ),
    }
    # the password is parsed whole: the good URL reaches the server as this role
    assert runs["current"].returncode == 0, runs["current"].stderr
    assert "(head)" in runs["current"].stdout
    for name, proc in runs.items():
        out = proc.stdout + proc.stderr
        assert not leaks(out), (name, out)
    for name in ("no such database", "nothing listening", "bad scheme"):
        assert runs[name].returncode != 0, name
        assert "***" in runs[name].stdout + runs[name].stderr, name
