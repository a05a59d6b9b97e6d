"""Multi-host store URLs as libpq takes them: parsed into one URL that SQLAlchemy's driver and
libpq both read with every host, and masked like any other URL."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from crossintercom.errors import StoreURLError
from crossintercom.storage.urls import mask_url, parse_store_url, with_password_file

HA = "postgresql://app:s3cr@t@db1:5432,db2:5433/mail?target_session_attrs=read-write"


def test_every_host_reaches_libpq_in_order() -> None:
    parsed = parse_store_url(HA)
    assert parsed.kind == "postgres"
    info = conninfo_to_dict(parsed.libpq_conninfo())
    assert info["host"] == "db1,db2"
    assert info["port"] == "5432,5433"
    assert info["dbname"] == "mail"
    assert info["user"] == "app"
    assert info["password"] == "s3cr@t"
    assert info["target_session_attrs"] == "read-write"
    assert parsed.hosts == ["db1:5432", "db2:5433"]


def test_every_host_reaches_the_sqlalchemy_driver() -> None:
    parsed = parse_store_url(HA)
    dialect = parsed.url.get_dialect()()
    _args, kwargs = dialect.create_connect_args(parsed.url)
    assert kwargs["host"] == "db1,db2"
    assert kwargs["port"] == "5432,5433"
    assert kwargs["target_session_attrs"] == "read-write"
    assert kwargs["password"] == "s3cr@t"


@pytest.mark.parametrize(
    ("raw", "hosts"),
    [
        ("postgresql://u@h1,h2,h3/db", ["h1", "h2", "h3"]),
        ("postgresql://u@h1:6000,h2/db", ["h1:6000", "h2"]),
        ("postgresql://u@[::1]:6000,127.0.0.1:6001/db", ["::1:6000", "127.0.0.1:6001"]),
        ("postgresql://u@/db?host=h1:7000&host=h2:7001", ["h1:7000", "h2:7001"]),
        ("postgresql://u@/db?host=h1,h2&port=7000,7001", ["h1:7000", "h2:7001"]),
        ("postgresql+psycopg://u@h1:5,h2:6/db", ["h1:5", "h2:6"]),
        ("postgresql://u@one:5432/db", ["one:5432"]),
    ],
)
def test_host_list_spellings(raw: str, hosts: list[str]) -> None:
    assert parse_store_url(raw).hosts == hosts


def test_a_host_list_without_a_database_is_refused_masked() -> None:
    with pytest.raises(StoreURLError) as err:
        parse_store_url("postgresql://u:hunter2@h1:5,h2:6")
    assert "hunter2" not in err.value.message
    assert "names no database" in err.value.message


def test_a_bad_host_list_is_refused_masked() -> None:
    with pytest.raises(StoreURLError) as err:
        parse_store_url("postgresql://u:hunter2@h1:5,:x/db")
    assert "hunter2" not in err.value.message


@pytest.mark.parametrize(
    "raw",
    [HA, "postgresql://u:p:w@h1,h2/db", "postgresql://u@h1,h2/db?password=p@w&sslmode=require"],
)
def test_masking_hides_the_password_of_a_host_list(raw: str) -> None:
    parsed = parse_store_url(raw)
    for shown in (parsed.masked, mask_url(raw)):
        assert "***" in shown
        assert "s3cr" not in shown and "p:w" not in shown and "p@w" not in shown
    assert parsed.masked.startswith("postgresql://")
    assert "h1" in parsed.masked or "db1" in parsed.masked


def test_password_file_keeps_the_host_list(tmp_path: object) -> None:
    from pathlib import Path

    secret = Path(str(tmp_path)) / "pw"
    secret.write_text("pa:ss@word\n")
    url = with_password_file(
        "postgresql://app@db1:5,db2:6/mail?target_session_attrs=read-write", str(secret)
    )
    parsed = parse_store_url(url)
    assert parsed.masked == "postgresql://app:***@db1:5,db2:6/mail?target_session_attrs=read-write"
    info = conninfo_to_dict(parsed.libpq_conninfo())
    assert info["password"] == "pa:ss@word"
    assert info["host"] == "db1,db2" and info["port"] == "5,6"
