"""The store over TLS only (docs/operations.md, "TLS"), on a cluster of its own whose
pg_hba.conf has ``hostssl`` lines alone: with the CA, client certificate and key given as
settings (options, environment, config.json), `db upgrade`, `db grant-host`, two hosts' relays
exchanging mail, `search` and the overseer page's view of the store all connect with
``sslmode=verify-full``; a wrong CA, a missing client certificate and a key others can read are
refused with one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crossintercom.tools.harness import relay_connected
from tests.conftest import make_env, run_cli, settings_for, wait_for
from tests.pgtls import NOCERT_DB, TlsServer
from tests.relay.conftest import Cluster, Host
from tests.web.conftest import start_web
from tests.web.test_overseer import request

pytestmark = pytest.mark.pg


def _tls_env(server: TlsServer, *, ca: Path | None = None) -> dict[str, str]:
    f = server.files
    return {
        "CROSSINTERCOM_STORE_SSL_ROOT_CERT": str(ca or f.ca),
        "CROSSINTERCOM_STORE_SSL_CERT": str(f.client_cert),
        "CROSSINTERCOM_STORE_SSL_KEY": str(f.client_key),
    }


def _refused(out: str, err: str, *words: str) -> None:
    """One line on stderr naming the cause; no traceback."""
    assert "Traceback" not in out + err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], lines[0]


def test_relays_db_search_and_the_page_connect_with_verify_full_and_a_client_certificate(
    tls_server: TlsServer, runtime_home: Path
) -> None:
    server, f = tls_server, tls_server.files
    server.create_database("mail")
    url = server.url("mail")
    env = make_env(runtime_home, "admin")

    # db upgrade with the files as options: nothing about TLS in the URL itself.
    flags = ("--store-ssl-root-cert", str(f.ca), "--store-ssl-cert", str(f.client_cert))
    upgraded = run_cli(
        env, "db", "upgrade", "--store", url, *flags, "--store-ssl-key", str(f.client_key)
    )
    assert upgraded.returncode == 0, upgraded.stderr
    # db grant-host with the files from the environment.
    tls_env = {**env, **_tls_env(server)}
    granted = run_cli(tls_env, "db", "grant-host", "B", "--store", url)
    assert granted.returncode == 0, granted.stderr

    with Cluster(url) as cluster:
        a = cluster.host("A", relay=False)
        b = cluster.host("B", relay=False)
        a.env.update(_tls_env(server))  # A: environment variables
        b_config = {
            "store_ssl_root_cert": str(f.ca),
            "store_ssl_cert": str(f.client_cert),
            "store_ssl_key": str(f.client_key),
        }
        (b.home / "config.json").write_text(json.dumps(b_config))  # B: config.json
        assert a.cli_json("archive", "on")["enabled"] is True
        for h in (a, b):
            h.start_relay()
        _mail_and_views(a, b)

        # Every backend of the relays is encrypted.
        with server.admin() as admin:
            plain = admin.execute(
                "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                "WHERE a.datname = 'mail' AND a.backend_type = 'client backend' AND NOT s.ssl"
            ).fetchone()
        assert plain == (0,)


def _mail_and_views(a: Host, b: Host) -> None:
    worker = b.listen("worker")
    a.wait_sees("worker", "B")
    sent = a.cli_json("send", "--as", "planner", "--to", "worker", "over tls ciphertext")
    assert sent["outcome"] == "delivered", sent
    assert worker.next_message()["id"] == sent["id"]

    # search reads the archive in the store (on B, whose files come from config.json).
    hits = b.cli_json("search", "ciphertext", "--json")
    assert [h["id"] for h in hits] == [sent["id"]]

    # The overseer page on A lists both hosts from the store.
    web = start_web(a)
    try:
        auth = {"Authorization": f"Bearer {web.token}"}

        def both_hosts() -> bool:
            status, roster = request(web.base + "/api/roster", headers=auth)
            assert status == 200, roster
            return {"A", "B"} <= {h["host"] for h in roster["hosts"]}

        wait_for(both_hosts, 30, "the page to list hosts A and B from the store")
    finally:
        web.stop()


def test_a_wrong_ca_no_client_certificate_or_an_open_key_is_refused_in_one_line(
    tls_server: TlsServer, runtime_home: Path, tmp_path: Path
) -> None:
    server, f = tls_server, tls_server.files
    env = make_env(runtime_home, "refused")
    # Server-side TLS alone (this database takes clients without a certificate).
    nocert = server.url(NOCERT_DB)
    ok = run_cli(env, "db", "upgrade", "--store", nocert, "--store-ssl-root-cert", str(f.ca))
    assert ok.returncode == 0, ok.stderr
    # Without the CA libpq is not asked to check anything, and the server wants TLS: refused.
    plain = run_cli(env, "db", "current", "--store", nocert + "?sslmode=disable")
    assert plain.returncode != 0
    _refused(plain.stdout, plain.stderr, "no encryption")

    # (with a password in the URL: the server ignores it, the error must not show it)
    with_password = nocert.replace("postgres@", "postgres:Pa55-w0rd@")
    wrong_ca = ("--store-ssl-root-cert", str(f.wrong_ca))
    wrong = run_cli(env, "db", "current", "--store", with_password, *wrong_ca)
    assert wrong.returncode != 0
    _refused(wrong.stdout, wrong.stderr, "certificate verify failed", "store_ssl_root_cert")
    assert "Pa55-w0rd" not in wrong.stdout + wrong.stderr

    # A database that wants a client certificate, reached without one.
    no_cert = run_cli(
        env, "db", "current", "--store", server.url("postgres"), "--store-ssl-root-cert", str(f.ca)
    )
    assert no_cert.returncode != 0
    _refused(no_cert.stdout, no_cert.stderr, "client certificate")

    # A key others can read, as libpq would refuse it; a certificate without its key.
    open_key = tmp_path / "open.key"
    open_key.write_bytes(f.client_key.read_bytes())
    open_key.chmod(0o644)
    loose = run_cli(
        {**env, **_tls_env(server), "CROSSINTERCOM_STORE_SSL_KEY": str(open_key)},
        "db",
        "current",
        "--store",
        nocert,
    )
    assert loose.returncode != 0
    _refused(loose.stdout, loose.stderr, str(open_key), "readable by others", "chmod 600")
    half = run_cli(env, "db", "current", "--store", nocert, "--store-ssl-cert", str(f.client_cert))
    _refused(half.stdout, half.stderr, "store_ssl_key")

    # A relay with the wrong CA (its options) stops at start with the same line, instead of
    # retrying.
    relay_env = {**env, "CROSSINTERCOM_STORE": nocert}
    relay = run_cli(relay_env, "relay", *wrong_ca, timeout=60)
    assert relay.returncode != 0
    _refused(relay.stdout, relay.stderr, "certificate verify failed")
    assert not relay_connected(settings_for(relay_env))
