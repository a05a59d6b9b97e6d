"""`crossintercom bench`: latency and throughput of every path beside raw baselines.

Each crossintercom figure is measured in the same run, on the same machine, as a raw baseline
that does the least work the path could possibly do:

* same-host send (sender -> broker -> live listener, ``delivered``) vs. a length-prefixed JSON
  frame echoed over a Unix socket by a tiny server thread of our own;
* cross-host send over the store (two simulated hosts, each its own broker + relay; a sender on
  alpha, listeners on beta, ``delivered``) vs. a bare INSERT + NOTIFY seen by a LISTEN connection
  (PostgreSQL), or an INSERT + doorbell file seen by a watchdog observer (SQLite);
* throughput of both, with several senders and many messages in flight, vs. raw frames/s over a
  socket and batched insert + claim (``FOR UPDATE SKIP LOCKED`` on PostgreSQL) rows/s.

The ratio targets of the project (cross-host PostgreSQL: latency p50 within 1.5x, throughput at
least 0.8x of raw) are reported as met / not met; nothing here asserts them. Everything the
benchmark starts (relays, brokers, listeners, threads, temporary files, its own raw table) is
stopped or removed before it returns. Run it against a scratch database: it registers two hosts
(``bench-alpha-*``, ``bench-beta-*``) and their sessions in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from crossintercom.client import AsyncClient, Identity
from crossintercom.config import Settings
from crossintercom.demo import SimHost, sim_host
from crossintercom.errors import CrossintercomError
from crossintercom.models import durable_session_id, new_id
from crossintercom.storage import migrate, parse_store_url

LATENCY_TARGET = 1.5  # crossintercom / raw, at most (cross-host PostgreSQL p50)
THROUGHPUT_TARGET = 0.8  # crossintercom / raw, at least (cross-host PostgreSQL)
HEADER = struct.Struct(">I")
TEXT_PAD = "x" * 100


@dataclass(frozen=True)
class Counts:
    same_latency: int
    cross_latency: int
    same_throughput: int
    cross_throughput: int
    raw_latency: int
    raw_rows: int
    senders: int = 4
    receivers: int = 2
    window: int = 16
    batch: int = 500

    @classmethod
    def for_run(cls, quick: bool) -> Counts:
        if quick:
            return cls(40, 30, 400, 400, 200, 4000)
        return cls(1000, 500, 5000, 5000, 2000, 50_000)


@dataclass
class Figure:
    path: str
    metric: str
    unit: str
    crossintercom: float
    baseline: float
    baseline_is: str
    higher_is_better: bool
    target: float | None = None
    ratio: float = 0.0
    target_met: bool | None = None

    def __post_init__(self) -> None:
        self.ratio = self.crossintercom / self.baseline if self.baseline > 0 else float("inf")
        if self.target is not None:
            self.target_met = (
                self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target
            )


@dataclass
class BenchReport:
    backend: str
    store: str
    quick: bool
    date: str
    counts: dict[str, int]
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def _text(i: int) -> str:
    return f"bench {i:07d} {TEXT_PAD}"


# --- raw baselines: Unix socket ---------------------------------------------------------------


def _read_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def _read_frame(sock: socket.socket) -> dict[str, Any]:
    (length,) = HEADER.unpack(_read_exact(sock, HEADER.size))
    body: dict[str, Any] = json.loads(_read_exact(sock, length))
    return body


def _frame(i: int) -> bytes:
    body = json.dumps(
        {
            "type": "send",
            "request_id": i,
            "message": {"id": new_id(), "to": "sink0@alpha", "message": _text(i)},
        }
    ).encode()
    return HEADER.pack(len(body)) + body


class EchoServer:
    """A thread that echoes every length-prefixed JSON frame back (decoded and re-encoded)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(64)
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._acceptor = threading.Thread(target=self._accept, name="bench-echo", daemon=True)

    def __enter__(self) -> EchoServer:
        self._acceptor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        for t in [self._acceptor, *self._threads]:
            t.join(5)
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    body = json.dumps(_read_frame(conn)).encode()
                    conn.sendall(HEADER.pack(len(body)) + body)
            except (ConnectionError, OSError):
                return


def raw_uds(root: Path, counts: Counts) -> tuple[list[float], float]:
    """Round-trip latencies (s) of one frame, and frames/s with several pipelined clients."""
    path = root / "echo.sock"
    with EchoServer(path):
        lat = []
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            for i in range(counts.raw_latency + 20):
                t0 = time.perf_counter()
                s.sendall(_frame(i))
                _read_frame(s)
                if i >= 20:
                    lat.append(time.perf_counter() - t0)

        per_client = max(counts.window, counts.same_throughput * 4 // counts.senders)

        def client(done: list[int]) -> None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(path))
                sent = 0
                while sent < per_client:
                    burst = min(counts.window, per_client - sent)
                    s.sendall(b"".join(_frame(sent + k) for k in range(burst)))
                    for _ in range(burst):
                        _read_frame(s)
                    sent += burst
                done.append(sent)

        done: list[int] = []
        threads = [threading.Thread(target=client, args=(done,)) for _ in range(counts.senders)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
    return lat, sum(done) / elapsed


# --- raw baselines: PostgreSQL ----------------------------------------------------------------

_PG_TABLE = "ci_bench_raw"


def raw_postgres(url: str, counts: Counts) -> tuple[list[float], float]:
    """INSERT + NOTIFY seen by LISTEN (latencies), and batched insert + SKIP LOCKED claim."""
    import psycopg

    conninfo = parse_store_url(url).libpq_conninfo()
    channel = f"ci_bench_{secrets.token_hex(4)}"
    with (
        psycopg.connect(conninfo, autocommit=True) as admin,
        psycopg.connect(conninfo, autocommit=True) as listener,
        psycopg.connect(conninfo) as writer,
        psycopg.connect(conninfo) as claimer,
    ):
        admin.execute(f"DROP TABLE IF EXISTS {_PG_TABLE}")
        admin.execute(
            f"CREATE TABLE {_PG_TABLE} (seq bigserial PRIMARY KEY, message_id text UNIQUE NOT "
            "NULL, recipient_host text NOT NULL, state text NOT NULL, payload jsonb NOT NULL)"
        )
        admin.execute(f"CREATE INDEX ON {_PG_TABLE} (recipient_host, seq) WHERE state = 'queued'")
        try:
            listener.execute(f"LISTEN {channel}")
            insert = (
                f"INSERT INTO {_PG_TABLE} (message_id, recipient_host, state, payload) "
                "VALUES (%s, 'beta', 'queued', %s)"
            )
            lat = []
            for i in range(counts.raw_latency + 20):
                payload = json.dumps({"id": new_id(), "message": _text(i)})
                t0 = time.perf_counter()
                with writer.transaction():
                    writer.execute(insert, (new_id(), payload))
                    writer.execute(f"NOTIFY {channel}")
                got = list(listener.notifies(timeout=5, stop_after=1))
                if not got:
                    raise CrossintercomError("the raw LISTEN connection saw no NOTIFY within 5 s")
                if i >= 20:
                    lat.append(time.perf_counter() - t0)

            claim = (
                f"SELECT seq FROM {_PG_TABLE} WHERE recipient_host = 'beta' AND state = 'queued' "
                "ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED"
            )
            mark = f"UPDATE {_PG_TABLE} SET state = 'delivered' WHERE seq = ANY(%s)"
            moved = 0
            t0 = time.perf_counter()
            while moved < counts.raw_rows:
                n = min(counts.batch, counts.raw_rows - moved)
                with writer.transaction(), writer.cursor() as cur:
                    cur.executemany(
                        insert,
                        [
                            (new_id(), json.dumps({"id": new_id(), "message": _text(k)}))
                            for k in range(n)
                        ],
                    )
                    cur.execute(f"NOTIFY {channel}")
                with claimer.transaction():
                    seqs = [r[0] for r in claimer.execute(claim, (counts.batch,))]
                    claimer.execute(mark, (seqs,))
                moved += len(seqs)
            rate = moved / (time.perf_counter() - t0)
        finally:
            admin.execute(f"DROP TABLE IF EXISTS {_PG_TABLE}")
    return lat, rate


# --- raw baselines: SQLite --------------------------------------------------------------------


def _sqlite_raw_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    db.execute("PRAGMA journal_mode=DELETE")
    db.execute(
        "CREATE TABLE IF NOT EXISTS raw (seq INTEGER PRIMARY KEY, message_id TEXT UNIQUE NOT "
        "NULL, recipient_host TEXT NOT NULL, state TEXT NOT NULL, payload TEXT NOT NULL)"
    )
    db.execute(
        "CREATE INDEX IF NOT EXISTS raw_inbound ON raw (recipient_host, seq) WHERE state = 'queued'"
    )
    return db


def raw_sqlite(path: Path, counts: Counts) -> tuple[list[float], float]:
    """INSERT + doorbell seen by a watchdog observer thread, and batched insert + claim."""
    from watchdog.events import FileSystemEvent, FileSystemEventHandler
    from watchdog.observers import Observer

    bells = path.with_name(path.name + ".bells")
    bells.mkdir(exist_ok=True)
    bell = bells / "beta"
    rung = threading.Event()

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event: FileSystemEvent) -> None:
            if os.fsdecode(event.src_path) == str(bell):
                rung.set()

    observer = Observer()
    observer.schedule(Handler(), str(bells), recursive=False)
    observer.start()
    db = _sqlite_raw_db(path)
    insert = (
        "INSERT INTO raw (message_id, recipient_host, state, payload) VALUES (?, 'beta', "
        "'queued', ?)"
    )
    try:
        lat = []
        for i in range(counts.raw_latency + 20):
            payload = json.dumps({"id": new_id(), "message": _text(i)})
            rung.clear()
            t0 = time.perf_counter()
            db.execute("BEGIN IMMEDIATE")
            db.execute(insert, (new_id(), payload))
            db.execute("COMMIT")
            bell.write_text(f"{i}\n")
            if not rung.wait(5):
                raise CrossintercomError("the raw watchdog observer saw no doorbell within 5 s")
            if i >= 20:
                lat.append(time.perf_counter() - t0)

        moved = 0
        t0 = time.perf_counter()
        while moved < counts.raw_rows:
            n = min(counts.batch, counts.raw_rows - moved)
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                insert,
                [(new_id(), json.dumps({"id": new_id(), "message": _text(k)})) for k in range(n)],
            )
            db.execute("COMMIT")
            db.execute("BEGIN IMMEDIATE")
            seqs = [
                r[0]
                for r in db.execute(
                    "SELECT seq FROM raw WHERE recipient_host = 'beta' AND state = 'queued' "
                    "ORDER BY seq LIMIT ?",
                    (counts.batch,),
                )
            ]
            db.executemany("UPDATE raw SET state = 'delivered' WHERE seq = ?", [(s,) for s in seqs])
            db.execute("COMMIT")
            moved += len(seqs)
        rate = moved / (time.perf_counter() - t0)
    finally:
        db.close()
        observer.stop()
        observer.join()
        shutil.rmtree(bells, ignore_errors=True)
        for p in (path, path.with_name(path.name + "-journal")):
            with contextlib.suppress(OSError):
                p.unlink()
    return lat, rate


# --- crossintercom paths ----------------------------------------------------------------------


@contextlib.contextmanager
def listeners(host: SimHost, names: list[str]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`crossintercom listen --as NAME` processes on a simulated host; stopped on exit."""
    procs = []
    try:
        for name in names:
            with open(host.settings.home / f"listen-{name}.log", "ab") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "crossintercom.cli.main", "listen", "--as", name],
                        env=host.env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )
                )
        yield procs
    finally:
        stop_processes(procs)


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def inbox_count(settings: Settings, name: str) -> int:
    """Messages saved in NAME's durable inbox on a host (0 before the file exists)."""
    path = settings.inbox_dir / f"{durable_session_id(settings.host_id, name)}.sqlite"
    if not path.exists():
        return 0
    db = sqlite3.connect(path, timeout=30.0)
    try:
        row = db.execute("SELECT count(*) FROM entries WHERE kind = 'message'").fetchone()
    except sqlite3.OperationalError:
        return 0  # the listener is still creating it
    finally:
        db.close()
    return int(row[0])


async def wait_for_sessions(
    client: AsyncClient, wanted: set[tuple[str, str]], timeout: float = 60.0
) -> None:
    """Until every (name, host) in ``wanted`` is listed online by ``client``'s broker."""
    deadline = time.monotonic() + timeout
    while True:
        seen = {(s.name, s.host) for s in await client.list_sessions() if s.online}
        if wanted <= seen:
            return
        if time.monotonic() > deadline:
            raise CrossintercomError(f"sessions never came online: {sorted(wanted - seen)}")
        await asyncio.sleep(0.1)


async def _latency(client: AsyncClient, target: str, n: int) -> tuple[list[float], Counter[str]]:
    lat: list[float] = []
    outcomes: Counter[str] = Counter()
    for i in range(n):
        t0 = time.perf_counter()
        r = await client.send(target, _text(i))
        lat.append(time.perf_counter() - t0)
        outcomes[r.outcome.value] += 1
    return lat, outcomes


async def _throughput(
    senders: list[AsyncClient],
    targets: list[str],
    inboxes: list[Callable[[], int]],
    total: int,
    window: int,
) -> tuple[float, Counter[str], float]:
    """Messages/s from several senders until every recipient's inbox holds them all."""
    before = [await asyncio.to_thread(f) for f in inboxes]
    outcomes: Counter[str] = Counter()
    per_sender = total // len(senders)

    async def blast(client: AsyncClient, target: str) -> None:
        gate = asyncio.Semaphore(window)

        async def one(i: int) -> None:
            async with gate:
                r = await client.send(target, _text(i))
                outcomes[r.outcome.value] += 1

        await asyncio.gather(*(one(i) for i in range(per_sender)))

    pairs = [(c, targets[k % len(targets)]) for k, c in enumerate(senders)]
    expected = Counter(t for _, t in pairs)
    t0 = time.perf_counter()
    await asyncio.gather(*(blast(c, t) for c, t in pairs))
    sent_s = time.perf_counter() - t0
    deadline = time.monotonic() + 60
    while True:
        now = [await asyncio.to_thread(f) for f in inboxes]
        if all(
            n - b >= expected[t] * per_sender for n, b, t in zip(now, before, targets, strict=True)
        ):
            break
        if time.monotonic() > deadline:
            raise CrossintercomError("not every message reached its recipient within 60 s")
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    return per_sender * len(senders) / elapsed, outcomes, sent_s


async def _crossintercom_paths(
    alpha: SimHost, beta: SimHost, counts: Counts, sinks: list[str]
) -> dict[str, Any]:
    senders = [
        AsyncClient(alpha.settings, Identity.named(alpha.settings, f"bench-s{k}", cwd="/"))
        for k in range(counts.senders)
    ]
    try:
        for c in senders:
            await c.connect()
        wanted = {(n, h.name) for n in sinks for h in (alpha, beta)}
        await wait_for_sessions(senders[0], wanted)
        local = [f"{n}@{alpha.name}" for n in sinks]
        remote = [f"{n}@{beta.name}" for n in sinks]
        await _latency(senders[0], local[0], 10)  # warm-up
        await _latency(senders[0], remote[0], 10)
        same_lat, same_out = await _latency(senders[0], local[0], counts.same_latency)
        cross_lat, cross_out = await _latency(senders[0], remote[0], counts.cross_latency)

        def counter(host: SimHost, name: str) -> Callable[[], int]:
            return lambda: inbox_count(host.settings, name)

        same_rate, same_tp_out, _ = await _throughput(
            senders,
            local,
            [counter(alpha, n) for n in sinks],
            counts.same_throughput,
            counts.window,
        )
        cross_rate, cross_tp_out, cross_sent_s = await _throughput(
            senders,
            remote,
            [counter(beta, n) for n in sinks],
            counts.cross_throughput,
            counts.window,
        )
    finally:
        for c in senders:
            await c.close()
    return {
        "same_latency": same_lat,
        "cross_latency": cross_lat,
        "same_rate": same_rate,
        "cross_rate": cross_rate,
        "outcomes": {
            "same_latency": dict(same_out),
            "cross_latency": dict(cross_out),
            "same_throughput": dict(same_tp_out),
            "cross_throughput": dict(cross_tp_out),
        },
        "cross_throughput_all_answered_s": round(cross_sent_s, 3),
    }


def wait_relays(hosts: list[SimHost], timeout: float = 30.0) -> None:
    from crossintercom.demo import _relay_up

    for host in hosts:
        deadline = time.monotonic() + timeout
        while not _relay_up(host):
            if time.monotonic() > deadline:
                raise CrossintercomError(f"the relay for {host.name} did not connect")
            time.sleep(0.1)


# --- the whole run ------------------------------------------------------------------------------


def run_bench(store_url: str | None = None, *, quick: bool = False) -> BenchReport:
    counts = Counts.for_run(quick)
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="ci-bench-"))
    try:
        url = store_url or f"sqlite:///{root / 'mailbox.sqlite'}"
        parsed = parse_store_url(url)
        migrate.upgrade(url)
        report = BenchReport(
            backend=parsed.kind,
            store=parsed.masked if store_url else "temporary SQLite file",
            quick=quick,
            date=datetime.now(UTC).isoformat(timespec="seconds"),
            counts={k: v for k, v in asdict(counts).items() if isinstance(v, int)},
        )
        uds_lat, uds_rate = raw_uds(root, counts)
        if parsed.kind == "postgres":
            db_lat, db_rate = raw_postgres(url, counts)
            db_lat_is = "INSERT + NOTIFY seen by a LISTEN connection"
            db_rate_is = "batched INSERT + SELECT ... FOR UPDATE SKIP LOCKED + UPDATE, rows/s"
        else:
            assert parsed.path is not None
            raw_path = parsed.path.with_name(f"{parsed.path.name}.bench-raw-{os.getpid()}")
            db_lat, db_rate = raw_sqlite(raw_path, counts)
            db_lat_is = "INSERT + doorbell file seen by a watchdog observer"
            db_rate_is = "batched INSERT + claim by state + UPDATE, rows/s"

        token = secrets.token_hex(2)
        sinks = [f"sink{k}" for k in range(counts.receivers)]
        with (
            sim_host(root, f"bench-alpha-{token}", url) as alpha,
            sim_host(root, f"bench-beta-{token}", url) as beta,
        ):
            wait_relays([alpha, beta])
            with listeners(alpha, sinks), listeners(beta, sinks):
                ci = asyncio.run(_crossintercom_paths(alpha, beta, counts, sinks))

        ms = 1000.0
        uds_is = "length-prefixed JSON frame echoed over a Unix socket (thread)"
        is_pg = parsed.kind == "postgres"
        report.figures = [
            Figure("same-host", "send latency p50", "ms",
                   percentile(ci["same_latency"], 50) * ms, percentile(uds_lat, 50) * ms,
                   uds_is, False),
            Figure("same-host", "send latency p99", "ms",
                   percentile(ci["same_latency"], 99) * ms, percentile(uds_lat, 99) * ms,
                   uds_is, False),
            Figure("same-host", "throughput", "msg/s", ci["same_rate"], uds_rate,
                   f"{uds_is}, {counts.senders} pipelined clients", True),
            Figure("cross-host", "send latency p50", "ms",
                   percentile(ci["cross_latency"], 50) * ms, percentile(db_lat, 50) * ms,
                   db_lat_is, False, LATENCY_TARGET if is_pg else None),
            Figure("cross-host", "send latency p99", "ms",
                   percentile(ci["cross_latency"], 99) * ms, percentile(db_lat, 99) * ms,
                   db_lat_is, False),
            Figure("cross-host", "throughput", "msg/s", ci["cross_rate"], db_rate,
                   db_rate_is, True, THROUGHPUT_TARGET if is_pg else None),
        ]  # fmt: skip
        report.details = {
            "outcomes": ci["outcomes"],
            "cross_throughput_all_answered_s": ci["cross_throughput_all_answered_s"],
            "cpus": os.cpu_count(),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report.elapsed_s = round(time.perf_counter() - started, 1)
    return report


def render(report: BenchReport) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"crossintercom bench ({report.backend}: {report.store}; "
        f"{'quick' if report.quick else 'full'} run, {report.date})"
    )
    for col in ("path", "metric", "crossintercom", "baseline", "ratio", "target"):
        table.add_column(col, justify="left" if col in ("path", "metric") else "right")
    for f in report.figures:
        fmt = "{:,.0f}" if f.unit == "msg/s" else "{:.2f}"
        if f.target is None:
            target = "-"
        else:
            sign = ">=" if f.higher_is_better else "<="
            target = f"{sign}{f.target}x {'met' if f.target_met else 'NOT met'}"
        table.add_row(
            f.path,
            f"{f.metric} ({f.unit})",
            fmt.format(f.crossintercom),
            fmt.format(f.baseline),
            f"{f.ratio:.2f}x",
            target,
        )
    console = Console()
    console.print(table)
    seen = set()
    for f in report.figures:
        if f.baseline_is not in seen:
            seen.add(f.baseline_is)
            console.print(f"  baseline ({f.path} {f.metric.split()[0]}): {f.baseline_is}")
    console.print(f"  outcomes: {report.details['outcomes']}")
    console.print(f"  took {report.elapsed_s} s; nothing left running")
