"""A throwaway PostgreSQL cluster that speaks TLS only, for the TLS tests (docs/operations.md,
"TLS"): a self-signed CA, a server certificate for 127.0.0.1 and localhost, a client
certificate for the ``postgres`` role, and a second CA that signed nothing of this server's.
All made with the ``openssl`` CLI in a temporary directory.

pg_hba.conf has ``hostssl`` lines only: database ``nocert`` takes any TLS client, every other
database also wants a client certificate whose CN is the role (``clientcert=verify-full``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from crossintercom.tools.pgcluster import ThrowawayPostgres, pg_bin
from tests.pgharness import _unprivileged_user, pg_unavailable

NOCERT_DB = "nocert"
HBA = f"""\
local all all trust
hostssl {NOCERT_DB} all 127.0.0.1/32 trust
hostssl all all 127.0.0.1/32 trust clientcert=verify-full
"""


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    wrong_ca: Path
    client_cert: Path
    client_key: Path


@dataclass
class TlsServer:
    cluster: ThrowawayPostgres
    files: TlsFiles

    def url(self, database: str) -> str:
        """The URL an operator writes: no TLS parameters (the settings add them)."""
        return f"postgresql://postgres@127.0.0.1:{self.cluster.port}/{database}"

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        """Over the cluster's Unix socket (trusted), not over TLS."""
        return psycopg.connect(
            host=str(self.cluster.root),
            port=self.cluster.port,
            user="postgres",
            dbname="postgres",
            autocommit=True,
        )

    def create_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _ca(cwd: Path, name: str) -> None:
    _openssl(
        cwd,
        *("req", "-x509", "-new", *_EC, "-days", "2", "-subj", f"/CN={name}"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
        *("-keyout", f"{name}.key", "-out", f"{name}.crt"),
    )


def _signed(cwd: Path, name: str, cn: str, ext: str) -> None:
    """``name``.crt/.key for ``cn``, signed by the CA ``ca``."""
    (cwd / f"{name}.ext").write_text(ext + "\n")
    _openssl(
        cwd,
        *("req", "-new", *_EC, "-subj", f"/CN={cn}", "-keyout", f"{name}.key"),
        *("-out", f"{name}.csr"),
    )
    _openssl(
        cwd,
        *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
        *("-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt"),
    )


def make_certificates(cwd: Path, *ips: str) -> TlsFiles:
    """A CA, a wrong CA, a server certificate for localhost (and ``ips``), a client's."""
    _ca(cwd, "ca")
    _ca(cwd, "wrong-ca")
    names = ",".join(["DNS:localhost", "IP:127.0.0.1", *(f"IP:{ip}" for ip in ips)])
    _signed(cwd, "server", "localhost", f"subjectAltName={names}\nextendedKeyUsage=serverAuth")
    _signed(cwd, "client", "postgres", "extendedKeyUsage=clientAuth")
    for key in cwd.glob("*.key"):
        key.chmod(0o600)
    return TlsFiles(cwd / "ca.crt", cwd / "wrong-ca.crt", cwd / "client.crt", cwd / "client.key")


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsServer]:
    missing = [p for p in ("openssl",) if shutil.which(p) is None]
    missing += [p for p in ("initdb", "pg_ctl") if pg_bin(p) is None]
    if missing:
        pg_unavailable(f"the TLS tests need {', '.join(missing)}")
    # A directory the server's user can enter (it runs unprivileged when the tests run as root).
    work = Path(tempfile.mkdtemp(prefix="ci-tls-", dir="/tmp"))
    work.chmod(0o755)
    run_as = _unprivileged_user() if os.geteuid() == 0 else None
    try:
        files = make_certificates(work)
        server_dir = work / "server"
        server_dir.mkdir()
        for name in ("server.crt", "server.key", "ca.crt"):
            shutil.copy(work / name, server_dir / name)
        (server_dir / "pg_hba.conf").write_text(HBA)
        (server_dir / "server.key").chmod(0o600)
        if run_as is not None:
            entry = pwd.getpwnam(run_as)
            for path in (server_dir, *server_dir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        cluster = ThrowawayPostgres(
            run_as=run_as,
            server_settings={
                "ssl": "on",
                "ssl_cert_file": str(server_dir / "server.crt"),
                "ssl_key_file": str(server_dir / "server.key"),
                "ssl_ca_file": str(server_dir / "ca.crt"),
                "hba_file": str(server_dir / "pg_hba.conf"),
            },
        )
        cluster.start()
    except (OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        pg_unavailable(f"could not start a TLS cluster: {exc}")
        raise
    server = TlsServer(cluster, files)
    try:
        server.create_database(NOCERT_DB)
        yield server
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
