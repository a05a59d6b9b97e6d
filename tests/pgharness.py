"""PostgreSQL for tests, found in the order the README's "Testing" section gives.

1. ``CROSSINTERCOM_TEST_PG_DSN`` (an admin DSN: it must be allowed to CREATE DATABASE);
2. a testcontainers ``PostgresContainer`` when a Docker engine answers;
3. the server on 127.0.0.1:5432 (user ``postgres``) when it accepts connections;
4. a throwaway cluster from the local ``initdb``/``pg_ctl``, run as an unprivileged user when
   the tests run as root.

None of them: the test is skipped, or fails when ``CROSSINTERCOM_REQUIRE_PG=1`` (CI).
Each test gets its own database, created from a template that ``db upgrade`` migrated once.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from crossintercom.tools.pgcluster import (
    UNPRIVILEGED_USERS,
    ThrowawayPostgres,
    existing_unprivileged_user,
)

REQUIRE_ENV = "CROSSINTERCOM_REQUIRE_PG"
DSN_ENV = "CROSSINTERCOM_TEST_PG_DSN"
LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class PgServer:
    """An admin connection string, and how to stop the server if we started it."""

    admin_url: str  # postgresql://… naming a maintenance database
    source: str
    stop: Callable[[], None] = field(default=lambda: None)

    def url_for(self, dbname: str, *, driver: str = "postgresql+psycopg") -> str:
        url = make_url(self.admin_url).set(drivername=driver, database=dbname)
        return url.render_as_string(hide_password=False)

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url_for("postgres", driver="postgresql"), autocommit=True)


def pg_unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"PostgreSQL required ({REQUIRE_ENV}=1) but unavailable: {reason}")
    pytest.skip(f"no PostgreSQL for tests: {reason}")


def _accepts(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return False  # a client without a daemon: do not wait for it to time out
    try:
        probe = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _from_container() -> PgServer | None:
    if not _docker_answers():
        return None
    try:
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16-alpine", driver=None)
        container.start()
    except Exception:
        return None
    return PgServer(container.get_connection_url(), "testcontainers", container.stop)


def _unprivileged_user() -> str:
    found = existing_unprivileged_user()
    if found is not None:
        return found
    subprocess.run(["useradd", "--system", "--no-create-home", UNPRIVILEGED_USERS[0]], check=True)
    return UNPRIVILEGED_USERS[0]


def _from_local_binaries() -> PgServer | None:
    try:
        cluster = ThrowawayPostgres(
            run_as=_unprivileged_user() if os.geteuid() == 0 else None
        ).start()
    except (RuntimeError, OSError, subprocess.SubprocessError):
        return None
    atexit.register(cluster.stop)
    return PgServer(cluster.url, "local binaries", cluster.stop)


@functools.cache
def find_postgres() -> PgServer | None:
    """The first PostgreSQL that works, searched once per test process."""
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        return PgServer(dsn, DSN_ENV) if _accepts(dsn) else None
    return (
        _from_container()
        or (PgServer(LOCAL_DSN, "127.0.0.1:5432") if _accepts(LOCAL_DSN) else None)
        or _from_local_binaries()
    )


def create_database(server: PgServer, template: str | None = None) -> str:
    name = f"ci_test_{uuid.uuid4().hex[:12]}"
    with server.admin() as conn:
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            stmt = sql.SQL("{} TEMPLATE {}").format(stmt, sql.Identifier(template))
        conn.execute(stmt)
    return name


def drop_database(server: PgServer, name: str) -> None:
    with server.admin() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    server = find_postgres()
    if server is None:
        pg_unavailable(
            f"set {DSN_ENV}, start Docker, run a server on 127.0.0.1:5432, "
            "or install the PostgreSQL server binaries"
        )
    assert server is not None
    yield server


@pytest.fixture(scope="session")
def pg_template(pg_server: PgServer) -> Iterator[str]:
    """A database migrated to head, copied for each test (much faster than migrating each)."""
    from crossintercom.storage import migrate

    name = create_database(pg_server)
    migrate.upgrade(pg_server.url_for(name))
    yield name
    drop_database(pg_server, name)


@pytest.fixture
def pg_empty_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh database without any schema."""
    name = create_database(pg_server)
    yield pg_server.url_for(name)
    drop_database(pg_server, name)


@pytest.fixture
def pg_url(pg_server: PgServer, pg_template: str) -> Iterator[str]:
    """A fresh database with the store's schema at head."""
    name = create_database(pg_server, template=pg_template)
    yield pg_server.url_for(name)
    drop_database(pg_server, name)
