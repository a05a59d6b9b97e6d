"""TLS files are settings like the password file (docs/operations.md, "TLS"): they become the
URL's sslrootcert/sslcert/sslkey, from config.json, the environment or options, and a key that
others can read is refused before libpq would be."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from crossintercom.config import load_settings
from crossintercom.errors import StoreURLError
from crossintercom.storage.connection import connection_url, with_tls_files


def _files(tmp_path: Path) -> tuple[Path, Path, Path]:
    ca, cert, key = tmp_path / "ca.crt", tmp_path / "client.crt", tmp_path / "client.key"
    for f in (ca, cert, key):
        f.write_text("-----BEGIN X-----\n")
    key.chmod(0o600)
    return ca, cert, key


def _query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def test_files_become_libpq_parameters_and_a_ca_asks_for_verify_full(tmp_path: Path) -> None:
    ca, cert, key = _files(tmp_path)
    url = with_tls_files("postgresql://u@db/mail", root_cert=str(ca), cert=str(cert), key=str(key))
    assert _query(url) == {
        "sslrootcert": [str(ca)],
        "sslcert": [str(cert)],
        "sslkey": [str(key)],
        "sslmode": ["verify-full"],
    }
    # An sslmode the URL names is kept; a host list is kept as written.
    multi = "postgresql://u:p%40w@h1:5432,h2:5433/mail?sslmode=verify-ca&target_session_attrs=any"
    url = with_tls_files(multi, root_cert=str(ca))
    assert url.startswith("postgresql://u:p%40w@h1:5432,h2:5433/mail?")
    assert _query(url)["sslmode"] == ["verify-ca"]
    assert _query(url)["target_session_attrs"] == ["any"]
    assert with_tls_files("postgresql://u@db/mail") == "postgresql://u@db/mail"


def test_unusable_files_are_refused_with_the_fix(tmp_path: Path) -> None:
    ca, cert, key = _files(tmp_path)
    key.chmod(0o644)
    with pytest.raises(StoreURLError, match=r"readable by others .*chmod 600"):
        with_tls_files("postgresql://u@db/mail", cert=str(cert), key=str(key))
    with pytest.raises(StoreURLError, match="go together"):
        with_tls_files("postgresql://u@db/mail", cert=str(cert))
    with pytest.raises(StoreURLError, match="cannot read the store's CA certificate"):
        with_tls_files("postgresql://u@db/mail", root_cert=str(tmp_path / "absent.crt"))
    with pytest.raises(StoreURLError, match="postgresql://"):
        with_tls_files(f"sqlite:///{tmp_path}/x.sqlite", root_cert=str(ca))


def test_settings_come_from_config_json_and_the_environment(tmp_path: Path) -> None:
    ca, cert, key = _files(tmp_path)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    config = {"store_url": "postgresql://u@db/mail", "store_ssl_root_cert": str(ca)}
    (home / "config.json").write_text(json.dumps(config))
    env = {
        "CROSSINTERCOM_HOME": str(home),
        "CROSSINTERCOM_STORE_SSL_CERT": str(cert),
        "CROSSINTERCOM_STORE_SSL_KEY": str(key),
    }
    settings = load_settings(env)
    url = connection_url(settings)
    assert url is not None
    assert _query(url)["sslrootcert"] == [str(ca)]
    assert _query(url)["sslkey"] == [str(key)]
    assert connection_url(load_settings({"CROSSINTERCOM_HOME": str(tmp_path)})) is None
