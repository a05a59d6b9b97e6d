"""Coordination features across simulated hosts: the two-host fixtures of tests/relay."""

from tests.pgharness import pg_server, pg_template, pg_url  # noqa: F401  (fixtures by name)
from tests.relay.conftest import (  # noqa: F401  (fixtures are found by name)
    backend,
    cluster,
    sqlite_cluster,
    sqlite_store,
    store_url,
)
