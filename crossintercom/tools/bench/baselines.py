"""Raw baselines: the least each path could do, with its far end in a process of its own.

Each baseline is set up once (``RawUDS``, ``RawPostgres``, ``RawSQLite``) and then measured in
rounds that the run alternates with the project's paths. One-way figures are timed from the
bench's ``time.time()`` before the write to the far process's ``time.time()`` at arrival (one
clock on one machine); round trips and rates on the bench's ``perf_counter``. See
docs/performance.md for what each one stands for and which project figure it is paired with.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import select
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Self

import msgspec

from crossintercom.errors import CrossintercomError
from crossintercom.models import new_id
from crossintercom.storage.plans import PlanRefresh
from crossintercom.tools.bench.workload import text
from crossintercom.tools.rawproc import HEADER

_RAWPROC = [sys.executable, "-m", "crossintercom.tools.rawproc"]
_WAIT_S = 10.0
_encoder = msgspec.json.Encoder()


class RawProc:
    """One far end (see ``rawproc``; the peer's consumer is ``peerproc``): started until it
    says ready, stopped by closing stdin."""

    def __init__(self, role: str, *args: str, module: str | None = None) -> None:
        self.role = role
        cmd = [*_RAWPROC, role] if module is None else [sys.executable, "-m", module]
        self.proc = subprocess.Popen(
            [*cmd, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        # Lines read off the raw pipe by hand: a buffered reader could hold a second line that
        # select() then no longer sees.
        self._pending = b""
        if self._line() != "ready":
            self.stop()
            raise CrossintercomError(f"the raw {role} process did not start")

    def _line(self, wait_s: float = _WAIT_S) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], wait_s)
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                raise CrossintercomError(f"the raw {self.role} process said nothing more")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode().strip()

    def arrival(self, wait_s: float = _WAIT_S) -> float:
        """The wall-clock time of the next arrival it reports, within ``wait_s``."""
        line = self._line(wait_s)
        try:
            return float(line)
        except ValueError:
            raise CrossintercomError(f"the raw {self.role} process said {line!r}") from None

    def stop(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _frame(i: int) -> bytes:
    body = _encoder.encode(
        {
            "type": "send",
            "request_id": i,
            "message": {"id": new_id(), "to": "sink0", "message": text(i)},
        }
    )
    return HEADER.pack(len(body)) + body


class _Stack:
    def __init__(self) -> None:
        self._procs: list[RawProc] = []
        self._undo: list[Any] = []

    def spawn(self, role: str, *args: str) -> RawProc:
        proc = RawProc(role, *args)
        self._procs.append(proc)
        return proc

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self._procs):
            proc.stop()
        for undo in reversed(self._undo):
            with contextlib.suppress(Exception):
                undo()


# --- Unix sockets -----------------------------------------------------------------------------


class RawUDS(_Stack):
    """An echo process, and a forwarder process in front of a sink process."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.echo_path = root / "raw-echo.sock"
        sink_path, self.forward_path = root / "raw-sink.sock", root / "raw-fwd.sock"
        self.echo = self.spawn("uds-echo", str(self.echo_path))
        self.sink = self.spawn("uds-sink", str(sink_path))
        self.spawn("uds-forward", str(self.forward_path), str(sink_path))

    async def one_way(self, n: int) -> list[float]:
        """bench -> forwarder -> sink, one frame at a time: seconds until the sink has it."""
        _, writer = await asyncio.open_unix_connection(self.forward_path)
        lat = []
        try:
            for i in range(n):
                t0 = time.time()
                writer.write(_frame(i))
                await writer.drain()
                lat.append(await asyncio.to_thread(self.sink.arrival) - t0)
        finally:
            writer.close()
        return lat

    async def round_trip(self, n: int) -> list[float]:
        """bench -> echo process -> bench, one frame at a time."""
        reader, writer = await asyncio.open_unix_connection(self.echo_path)
        lat = []
        try:
            for i in range(n):
                t0 = time.perf_counter()
                writer.write(_frame(i))
                (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                await reader.readexactly(length)
                lat.append(time.perf_counter() - t0)
        finally:
            writer.close()
        return lat

    async def pipelined(self, total: int, senders: int, window: int) -> float:
        """Frames/s through the echo process from ``senders`` clients, ``window`` in flight."""

        async def client(count: int) -> None:
            reader, writer = await asyncio.open_unix_connection(self.echo_path)
            try:
                sent = 0
                while sent < count:
                    burst = min(window, count - sent)
                    writer.write(b"".join(_frame(sent + k) for k in range(burst)))
                    for _ in range(burst):
                        (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                        await reader.readexactly(length)
                    sent += burst
            finally:
                writer.close()

        per = total // senders
        t0 = time.perf_counter()
        await asyncio.gather(*(client(per) for _ in range(senders)))
        return per * senders / (time.perf_counter() - t0)


# --- PostgreSQL -------------------------------------------------------------------------------

_PG_TABLE = "ci_bench_raw"


class RawPostgres(_Stack):
    """INSERT + NOTIFY seen by a LISTEN process; request/reply through a responder process;
    batched INSERT + ``SKIP LOCKED`` claim. The table is the bench's own, dropped at the end."""

    def __init__(self, conninfo: str) -> None:
        import psycopg

        super().__init__()
        tag = secrets.token_hex(4)
        self.channel, self.req, self.rep = f"ci_bench_{tag}", f"ci_breq_{tag}", f"ci_brep_{tag}"
        self.admin = psycopg.connect(conninfo, autocommit=True)
        self._undo.append(self.admin.close)
        self.admin.execute(f"DROP TABLE IF EXISTS {_PG_TABLE}")
        self.admin.execute(
            f"CREATE TABLE {_PG_TABLE} (seq bigserial PRIMARY KEY, message_id text UNIQUE NOT "
            "NULL, recipient_host text NOT NULL, state text NOT NULL, payload jsonb NOT NULL)"
        )
        self._undo.append(lambda: self.admin.execute(f"DROP TABLE IF EXISTS {_PG_TABLE}"))
        self.admin.execute(
            f"CREATE INDEX ON {_PG_TABLE} (recipient_host, seq) WHERE state = 'queued'"
        )
        # The responder's claim: without it, a scan of every row of every round before.
        self.admin.execute(f"CREATE INDEX ON {_PG_TABLE} (seq) WHERE state = 'request'")
        self.writer = psycopg.connect(conninfo)
        self.asker = psycopg.connect(conninfo, autocommit=True)
        self._undo += [self.writer.close, self.asker.close]
        self.asker.execute(f"LISTEN {self.rep}")
        # Plans dropped on the store's own schedule (storage/plans.py): like with like.
        self._plans = PlanRefresh()
        self.listener = self.spawn("pg-listen", conninfo, self.channel)
        self.spawn("pg-respond", conninfo, _PG_TABLE, self.req, self.rep)
        self._insert = (
            f"INSERT INTO {_PG_TABLE} (message_id, recipient_host, state, payload) "
            "VALUES (%s, 'beta', %s, %s)"
        )

    def _payload(self, i: int) -> str:
        return _encoder.encode({"id": new_id(), "message": text(i)}).decode()

    def _refresh(self) -> None:
        refresh = self._plans.statement()
        if refresh is not None:
            self.writer.execute(refresh)
            self.writer.commit()

    def one_way(self, n: int) -> list[float]:
        lat = []
        for i in range(n):
            self._refresh()
            t0 = time.time()
            with self.writer.transaction():
                self.writer.execute(self._insert, (new_id(), "queued", self._payload(i)))
                self.writer.execute(f"NOTIFY {self.channel}")
            lat.append(self.listener.arrival() - t0)
        return lat

    def round_trip(self, n: int) -> list[float]:
        lat = []
        for i in range(n):
            self._refresh()
            t0 = time.perf_counter()
            with self.writer.transaction():
                self.writer.execute(self._insert, (new_id(), "request", self._payload(i)))
                self.writer.execute(f"NOTIFY {self.req}")
            if not list(self.asker.notifies(timeout=_WAIT_S, stop_after=1)):
                raise CrossintercomError("the raw PostgreSQL responder did not answer")
            lat.append(time.perf_counter() - t0)
        return lat

    def batched_claim(self, rows: int, batch: int) -> float:
        claim = (
            f"SELECT seq FROM {_PG_TABLE} WHERE recipient_host = 'beta' AND state = 'queued' "
            "ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED"
        )
        mark = f"UPDATE {_PG_TABLE} SET state = 'delivered' WHERE seq = ANY(%s)"
        moved = 0
        self._refresh()
        t0 = time.perf_counter()
        while moved < rows:
            n = min(batch, rows - moved)
            with self.writer.transaction(), self.writer.cursor() as cur:
                cur.executemany(
                    self._insert, [(new_id(), "queued", self._payload(k)) for k in range(n)]
                )
                cur.execute(f"NOTIFY {self.channel}")
            self.listener.arrival()
            with self.writer.transaction():
                seqs = [r[0] for r in self.writer.execute(claim, (batch,))]
                self.writer.execute(mark, (seqs,))
            moved += len(seqs)
        return moved / (time.perf_counter() - t0)


# --- SQLite -----------------------------------------------------------------------------------


class RawSQLite(_Stack):
    """INSERT + doorbell seen by a watchdog process; request/reply through a responder process;
    one-row transactions per second. The file is the bench's own, beside the store's."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.bells = path.with_name(path.name + ".bells")
        self.bells.mkdir(exist_ok=True)
        # Used from one worker thread at a time (the bench runs it off its event loop).
        self.db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._undo.append(self.db.close)
        self.db.execute("PRAGMA journal_mode=DELETE")  # as the shared store runs
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS raw (seq INTEGER PRIMARY KEY, message_id TEXT UNIQUE "
            "NOT NULL, recipient_host TEXT NOT NULL, state TEXT NOT NULL, payload TEXT NOT NULL)"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS raw_state ON raw (state, seq)")
        self.watcher = self.spawn("bell-watch", str(self.bells), "beta")
        self.replies = self.spawn("bell-watch", str(self.bells), "reply")
        self.spawn("bell-respond", str(path), str(self.bells))
        self._insert = (
            "INSERT INTO raw (message_id, recipient_host, state, payload) VALUES (?, 'beta', ?, ?)"
        )

    def _row(self, state: str, i: int) -> None:
        payload = _encoder.encode({"id": new_id(), "message": text(i)}).decode()
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute(self._insert, (new_id(), state, payload))
        self.db.execute("COMMIT")

    def one_way(self, n: int) -> list[float]:
        lat = []
        for i in range(n):
            t0 = time.time()
            self._row("queued", i)
            (self.bells / "beta").write_text(str(i))
            lat.append(self.watcher.arrival() - t0)
        return lat

    def round_trip(self, n: int) -> list[float]:
        lat = []
        for i in range(n):
            t0 = time.perf_counter()
            self._row("request", i)
            (self.bells / "request").write_text(str(i))
            self.replies.arrival()
            lat.append(time.perf_counter() - t0)
        return lat

    def tx_rate(self, n: int) -> float:
        """One-row write transactions per second (BEGIN IMMEDIATE, INSERT, COMMIT)."""
        t0 = time.perf_counter()
        for i in range(n):
            self._row("done", i)
        return n / (time.perf_counter() - t0)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        import shutil

        shutil.rmtree(self.bells, ignore_errors=True)
        for p in (self.path, self.path.with_name(self.path.name + "-journal")):
            with contextlib.suppress(OSError):
                p.unlink()
