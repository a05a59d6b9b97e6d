"""Raw cross-host baselines: the least the store could do per message, on each backend.

PostgreSQL: INSERT + NOTIFY seen by a LISTEN connection, and batched INSERT + claim with
``FOR UPDATE SKIP LOCKED``. SQLite: INSERT + a doorbell file seen by a watchdog observer, and
batched INSERT + claim by state inside ``BEGIN IMMEDIATE``. Each uses a table of its own, dropped
or deleted afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sqlite3
import threading
import time
from pathlib import Path

from crossintercom.errors import CrossintercomError
from crossintercom.models import new_id
from crossintercom.tools.bench.workload import Counts, text

# --- PostgreSQL -------------------------------------------------------------------------------

_PG_TABLE = "ci_bench_raw"


def raw_postgres(conninfo: str, counts: Counts) -> tuple[list[float], float]:
    """INSERT + NOTIFY seen by LISTEN (latencies), and batched insert + SKIP LOCKED claim."""
    import psycopg

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
                payload = json.dumps({"id": new_id(), "message": text(i)})
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
                            (new_id(), json.dumps({"id": new_id(), "message": text(k)}))
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


# --- SQLite -----------------------------------------------------------------------------------


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
            payload = json.dumps({"id": new_id(), "message": text(i)})
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
                [(new_id(), json.dumps({"id": new_id(), "message": text(k)})) for k in range(n)],
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
