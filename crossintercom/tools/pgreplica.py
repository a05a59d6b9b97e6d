"""A throwaway primary + streaming standby, for failover tests and `chaos --faults pg_failover`.

Two ``pgcluster.ThrowawayPostgres`` clusters on ports of their own: the primary from initdb,
the standby from its base backup (``pg_basebackup -R``: a ``standby.signal`` and the
``primary_conninfo`` to stream from). ``synchronous=True`` names the standby in the primary's
``synchronous_standby_names`` (with ``synchronous_commit=on``, the default): a COMMIT returns
once the standby has the WAL, so nothing acknowledged is lost when it is promoted.

``url`` names both hosts as libpq takes them, with ``target_session_attrs=read-write``: a
client connects to whichever of them is the primary now (docs/operations.md, "High
availability"). ``fail_over()`` promotes the standby and stops the old primary (as a crash);
``rejoin()`` brings the old primary back as a standby of the new one (``pg_rewind``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Self

import psycopg

from crossintercom.tools.pgcluster import ThrowawayPostgres, pg_bin

# The names the servers give their WAL receivers (cluster_name is the walreceiver's
# application_name): what synchronous_standby_names lists.
NODE_NAMES = ("node_a", "node_b")
READY_S = 60.0
# WAL kept for a standby that falls behind (a rejoining old primary catches up from it).
REPLICATION_SETTINGS = {"wal_keep_size": "256MB"}


class _Node(ThrowawayPostgres):
    """One server of the pair; a standby's data is a base backup of ``source``."""

    # pg_rewind needs checksums (or wal_log_hints, which a -c option would not give the
    # single-user recovery pg_rewind runs on a crashed target first).
    initdb_options = ("--data-checksums",)

    def __init__(self, name: str, source: _Node | None = None) -> None:
        super().__init__(server_settings={"cluster_name": name})
        self.name = name
        self._source = source

    def _make_data(self) -> None:
        if self._source is None:
            super()._make_data()
            # In the file, not -c options: pg_rewind's single-user recovery of a crashed
            # target reads only the file, and would otherwise recycle the WAL it needs.
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.writelines(f"{k} = '{v}'\n" for k, v in REPLICATION_SETTINGS.items())
            return
        self.base_backup_of(self._source)

    def base_backup_of(self, source: _Node) -> None:
        basebackup = pg_bin("pg_basebackup")
        if basebackup is None:
            raise RuntimeError("pg_basebackup not found (install the PostgreSQL server)")
        conninfo = f"host=127.0.0.1 port={source.port} user=postgres"
        # A fast checkpoint: the default spread one can take minutes on a just promoted server.
        self.run(
            basebackup, "-D", str(self.data), "-d", conninfo, "-R", "-X", "stream", "-c", "fast"
        )

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def query(self, sql: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        with psycopg.connect(self.conninfo(dbname), autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    def in_recovery(self) -> bool:
        return bool(self.query("SELECT pg_is_in_recovery()")[0][0])


def _until(what: str, check: Callable[[], bool], deadline_s: float = READY_S) -> None:
    """Poll ``check()`` (errors count as not yet) until it is true, or fail naming ``what``."""
    end = time.monotonic() + deadline_s
    last: BaseException | None = None
    while time.monotonic() < end:
        try:
            if check():
                return
        except (psycopg.Error, OSError) as exc:
            last = exc
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {deadline_s:.0f} s ({last})")


class ReplicatedPostgres:
    """``start()`` brings up the primary and its standby, streaming; ``stop()`` removes both."""

    def __init__(self, *, synchronous: bool = True) -> None:
        self.synchronous = synchronous
        self.primary = _Node(NODE_NAMES[0])
        self.standby: _Node | None = None
        self.failovers = 0
        self.stopped_after_s = 0.0  # the last fail_over: from its start to the old primary's stop
        self.rewind_error: str | None = None  # why the last rejoin took a fresh base backup
        self._stopped: _Node | None = None  # the old primary, between fail_over and rejoin

    @property
    def nodes(self) -> list[_Node]:
        return [n for n in (self.primary, self.standby) if n is not None]

    def url(self, dbname: str = "postgres") -> str:
        """Both hosts, in start order (the first is the original primary)."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in sorted(self.nodes, key=_first))
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def start(self) -> Self:
        try:
            self.primary.start()
            self.standby = _Node(NODE_NAMES[1], source=self.primary).start()
            self._streaming(self.primary, self.standby)
        except BaseException:
            self.stop()
            raise
        return self

    def _streaming(self, primary: _Node, standby: _Node) -> None:
        """Until ``standby`` streams from ``primary``; then, if synchronous, made its
        synchronous standby (a sync name set earlier would hold every commit meanwhile)."""
        name = standby.name

        def streams() -> bool:
            rows = primary.query(
                f"SELECT 1 FROM pg_stat_replication WHERE application_name = '{name}' "
                "AND state = 'streaming'"
            )
            return bool(rows)

        _until(f"standby {name} streaming from port {primary.port}", streams)
        if not self.synchronous:
            return
        primary.query(f"ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'")
        primary.query("SELECT pg_reload_conf()")

        def sync() -> bool:
            rows = primary.query(
                f"SELECT sync_state FROM pg_stat_replication WHERE application_name = '{name}'"
            )
            return bool(rows) and rows[0][0] == "sync"

        _until(f"standby {name} synchronous", sync)

    def create_database(self, dbname: str) -> str:
        """A database on the primary, once the standby has it too; its multi-host URL."""
        self.primary.query(f'CREATE DATABASE "{dbname}"')
        if self.standby is not None:
            standby = self.standby
            _until(f"{dbname} on the standby", lambda: bool(standby.query("SELECT 1", dbname)))
        return self.url(dbname)

    def fail_over(self, *, stop_mode: str = "immediate") -> float:
        """Promote the standby, then stop the old primary (``immediate``: as a crash). Returns
        how long the promotion took. The standby becomes ``primary``; there is no standby
        until ``rejoin()``."""
        assert self.standby is not None
        old, new = self.primary, self.standby
        started = time.monotonic()
        new.run(new._pg_ctl, "-D", str(new.data), "-w", "promote")
        _until("promoted standby accepting writes", lambda: not new.in_recovery())
        took = time.monotonic() - started
        with contextlib.suppress(RuntimeError):
            old.halt(stop_mode)
        # Until here the old primary took writes: what it had not streamed is lost (async).
        self.stopped_after_s = time.monotonic() - started
        self.primary, self.standby = new, None
        self._stopped = old
        self.failovers += 1
        return took

    def stop_primary_only(self, mode: str = "immediate") -> None:
        """The primary gone, the standby left as it is (not promoted)."""
        self.primary.halt(mode)

    def rejoin(self) -> float:
        """The old primary back as a standby of the new one: ``pg_rewind`` of its data onto
        the new primary's timeline (a fresh base backup when rewinding fails), then streaming
        (and synchronous, if the pair is). Returns how long it took."""
        old = self._stopped
        assert old is not None, "rejoin() follows fail_over()"
        started = time.monotonic()
        rewind = pg_bin("pg_rewind")
        try:
            if rewind is None:
                raise RuntimeError("pg_rewind not found")
            # Until a checkpoint, the new primary's control file still names the old
            # timeline, and pg_rewind would find nothing to rewind.
            self.primary.query("CHECKPOINT")
            old.run(
                rewind,
                "--target-pgdata",
                str(old.data),
                "--source-server",
                self.primary.conninfo(),
                "--write-recovery-conf",
                timeout=300,
            )
        except RuntimeError as exc:
            self.rewind_error = str(exc)
            old.wipe_data()
            old.base_backup_of(self.primary)
        old.launch()
        self._streaming(self.primary, old)
        # Only now the standby again: a fail_over() meanwhile would promote a standby not yet
        # synchronous (and lose what it had not streamed) and stop the primary streamed from.
        self.standby, self._stopped = old, None
        return time.monotonic() - started

    def replication(self) -> list[tuple[str, str, str]]:
        """(application_name, state, sync_state) of each standby of the primary."""
        rows = self.primary.query(
            "SELECT application_name, state, sync_state FROM pg_stat_replication"
        )
        return [(str(a), str(b), str(c)) for a, b, c in rows]

    def stop(self) -> None:
        for node in (*self.nodes, self._stopped):
            if node is not None:
                node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _first(node: _Node) -> int:
    return NODE_NAMES.index(node.name)
