"""The store password stays off every command line: the relay and `db upgrade` read it from a
file (``--store-password-file`` / ``CROSSINTERCOM_STORE_PASSWORD_FILE``), or libpq's own
``PGPASSWORD`` / ``~/.pgpass`` (docs/operations.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from crossintercom.errors import StoreURLError
from crossintercom.storage.urls import with_password_file
from crossintercom.tools.harness import relay_connected
from tests.conftest import CLI, make_env, run_cli, settings_for, wait_for

SECRET = "s3cr3t-Pa55@:word"


def _password_file(tmp_path: Path) -> Path:
    f = tmp_path / "store.password"
    f.write_text(SECRET + "\n")
    f.chmod(0o600)
    return f


def test_password_file_sets_the_password_in_memory(tmp_path: Path) -> None:
    url = with_password_file("postgresql://relay@db.example/mail", str(_password_file(tmp_path)))
    assert make_url(url).password == SECRET
    assert with_password_file("postgresql://relay@db.example/mail", None).endswith(
        "@db.example/mail"
    )
    with pytest.raises(StoreURLError, match="cannot read the store password file"):
        with_password_file("postgresql://relay@db/mail", str(tmp_path / "absent"))
    with pytest.raises(StoreURLError, match="postgresql://"):
        with_password_file("sqlite:////tmp/x.sqlite", str(_password_file(tmp_path)))


@pytest.mark.pg
def test_relay_and_db_upgrade_keep_the_password_off_the_command_line(
    pg_url: str, runtime_home: Path, tmp_path: Path
) -> None:
    password_file = _password_file(tmp_path)
    # The URL the operator writes has no password; the test server accepts any.
    bare = make_url(pg_url).set(password=None).render_as_string(hide_password=False)
    env = make_env(runtime_home, "secrets-host")

    upgrade = run_cli(
        env, "db", "upgrade", "--store", bare, "--store-password-file", str(password_file)
    )
    assert upgrade.returncode == 0, upgrade.stderr
    assert SECRET not in upgrade.stdout + upgrade.stderr

    relay_env = {**env, "CROSSINTERCOM_STORE_PASSWORD_FILE": str(password_file)}
    proc = subprocess.Popen(
        [*CLI, "relay", "--store", bare],
        env=relay_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        cfg = settings_for(env)
        wait_for(lambda: proc.poll() is None and relay_connected(cfg), 30, "the relay to connect")
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert b"relay" in cmdline
        assert SECRET.encode() not in cmdline
        assert SECRET.encode() not in environ
        status = run_cli(env, "status", "--json")
        assert SECRET not in status.stdout
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert SECRET.encode() not in err
