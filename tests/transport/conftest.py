"""How the store is reached: over TLS (a cluster of the tests' own) and through a real
PgBouncer in front of PostgreSQL (docs/operations.md, "High availability")."""

from __future__ import annotations

from tests.pgharness import (  # noqa: F401  (fixtures are found by name)
    pg_empty_url,
    pg_server,
    pg_template,
    pg_url,
)
from tests.pgtls import tls_server  # noqa: F401
