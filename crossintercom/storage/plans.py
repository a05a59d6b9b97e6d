"""When a PostgreSQL connection drops its prepared statements, so that they are planned again.

psycopg prepares a statement on the server after a few executions, and the server then keeps
one generic plan for it for the life of the connection, re-planning only when the tables'
statistics change. A store starts empty: a plan made then sees tables of a few pages, where a
sequential scan is the cheapest way to look up a row, and keeps scanning as they grow to
millions of rows unless something runs ANALYZE (autovacuum does; a server with it off never
does). So every store connection drops its plans (``queries.pg_deallocate_all``) now and
then, on a schedule that starts soon after it connects and backs off: the next plan is made
on the tables as they are by then (docs/perf-log/2026-12.md, "Plans made on empty tables").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from crossintercom.storage.queries import pg_deallocate_all

FIRST_AFTER_S = 2.0  # the first refresh comes this long after connecting...
FIRST_AFTER_STATEMENTS = 64  # ...or after this many statements, whichever is first
MAX_AFTER_S = 600.0  # each gap doubles, up to these
MAX_AFTER_STATEMENTS = 16_384


@dataclass
class PlanRefresh:
    """The schedule of one connection. ``due()`` says whether to drop its plans before the
    next statement, and counts that statement; after a refresh both gaps double."""

    after_s: float = FIRST_AFTER_S
    after_statements: int = FIRST_AFTER_STATEMENTS
    since: float = field(default_factory=time.monotonic)
    statements: int = 0
    refreshes: int = 0

    def due(self) -> bool:
        self.statements += 1
        now = time.monotonic()
        if self.statements < self.after_statements and now - self.since < self.after_s:
            return False
        self.after_s = min(MAX_AFTER_S, self.after_s * 2)
        self.after_statements = min(MAX_AFTER_STATEMENTS, self.after_statements * 2)
        self.since, self.statements = now, 0
        self.refreshes += 1
        return True

    def statement(self) -> str | None:
        """What to run before the next statement when a refresh is due (a text new each time:
        ``queries.pg_deallocate_all``), else None; counts that statement as ``due`` does."""
        return pg_deallocate_all(self.refreshes) if self.due() else None
