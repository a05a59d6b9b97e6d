"""The far ends of the benchmark's raw baselines (`crossintercom bench`), each a process of its own.

``python -m crossintercom.tools.rawproc ROLE ARGS...`` (a module of its own so that it starts
without importing the benchmark) prints ``ready`` once it can be
used, then works until its stdin closes (the bench closes it to stop it). A role that observes
arrivals prints one line per arrival: the wall-clock time it saw it (``time.time()``, the clock
the inbox's ``received_at`` uses), so the bench can time one-way paths across processes.

Roles:

* ``uds-echo PATH``: echoes every length-prefixed frame back (decoded and re-encoded);
* ``uds-forward PATH SINK``: passes every frame on to the socket ``SINK`` (the broker's hop);
* ``uds-sink PATH``: prints the arrival time of every frame (the recipient's hop);
* ``pg-listen CONNINFO CHANNEL``: prints the arrival time of every NOTIFY;
* ``pg-respond CONNINFO TABLE CHANNEL REPLY_CHANNEL``: on each NOTIFY claims the queued request
  rows and, in the same transaction, inserts a reply row per request and NOTIFYs back;
* ``bell-watch DIR NAME``: a watchdog observer that prints the arrival time of every write of
  ``DIR/NAME``;
* ``bell-respond DB DIR``: on each ring of ``DIR/request`` claims the queued requests of the
  SQLite file ``DB``, inserts their replies in the same transaction and rings ``DIR/reply``.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

HEADER = struct.Struct(">I")


def _ready_then_wait(stop: Callable[[], None] | None = None) -> None:
    print("ready", flush=True)
    sys.stdin.read()
    if stop is not None:
        stop()


def _arrived() -> None:
    sys.stdout.write(f"{time.time():.6f}\n")
    sys.stdout.flush()


# --- Unix sockets -----------------------------------------------------------------------------


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    return await reader.readexactly(length)


def _frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


async def _serve_uds(path: str, role: str, sink: str | None) -> None:
    import msgspec

    decoder, encoder = msgspec.json.Decoder(), msgspec.json.Encoder()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        out: asyncio.StreamWriter | None = None
        if sink is not None:
            _, out = await asyncio.open_unix_connection(sink)
        try:
            while True:
                body = await _read_frame(reader)
                if role == "uds-echo":
                    writer.write(_frame(encoder.encode(decoder.decode(body))))
                elif out is not None:
                    out.write(_frame(encoder.encode(decoder.decode(body))))
                else:
                    decoder.decode(body)
                    _arrived()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            if out is not None:
                out.close()

    server = await asyncio.start_unix_server(handle, path)
    async with server:
        done = asyncio.get_running_loop().run_in_executor(None, _ready_then_wait)
        await done


# --- PostgreSQL -------------------------------------------------------------------------------


def _pg_listen(conninfo: str, channel: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"LISTEN {channel}")
        stopping = threading.Event()
        threading.Thread(target=_ready_then_wait, args=(stopping.set,), daemon=True).start()
        while not stopping.is_set():
            for _ in conn.notifies(timeout=0.2):
                _arrived()


def _pg_respond(conninfo: str, table: str, channel: str, reply_channel: str) -> None:
    import psycopg

    from crossintercom.storage.plans import PlanRefresh

    # One statement: claim every queued request, insert its reply, notify the asker.
    respond = (
        f"WITH claimed AS (UPDATE {table} SET state = 'done' WHERE state = 'request' "
        "RETURNING message_id), replies AS ("
        f"INSERT INTO {table} (message_id, recipient_host, state, payload) "
        "SELECT 'r-' || message_id, 'alpha', 'reply', '{}' FROM claimed RETURNING 1) "
        f"SELECT pg_notify('{reply_channel}', '') FROM (SELECT count(*) AS n FROM replies) r "
        "WHERE r.n > 0"
    )
    with (
        psycopg.connect(conninfo, autocommit=True) as listen,
        psycopg.connect(conninfo, autocommit=True) as work,
    ):
        listen.execute(f"LISTEN {channel}")
        plans = PlanRefresh()
        stopping = threading.Event()
        threading.Thread(target=_ready_then_wait, args=(stopping.set,), daemon=True).start()
        while not stopping.is_set():
            for _ in listen.notifies(timeout=0.2):
                refresh = plans.statement()  # the store's schedule: like with like
                if refresh is not None:
                    work.execute(refresh)
                work.execute(respond)


# --- SQLite doorbells -------------------------------------------------------------------------


def _watch(directory: str, name: str, on_ring: Callable[[], None]) -> None:
    from watchdog.events import FileSystemEvent, FileSystemEventHandler
    from watchdog.observers import Observer

    bell = os.path.join(directory, name)

    class Handler(FileSystemEventHandler):
        # Closed after writing: one event per ring (a rewrite also sends two "modified").
        def on_closed(self, event: FileSystemEvent) -> None:
            if os.fsdecode(event.src_path) == bell:
                on_ring()

    observer = Observer()
    observer.schedule(Handler(), directory, recursive=False)
    observer.start()
    try:
        _ready_then_wait()
    finally:
        observer.stop()
        observer.join()


def _bell_respond(db_path: str, directory: str) -> None:
    import sqlite3

    db = sqlite3.connect(db_path, timeout=30.0, isolation_level=None, check_same_thread=False)
    reply_bell = Path(directory) / "reply"
    lock = threading.Lock()

    def respond() -> None:
        with lock:
            db.execute("BEGIN IMMEDIATE")
            ids = [r[0] for r in db.execute("SELECT message_id FROM raw WHERE state = 'request'")]
            db.executemany(
                "UPDATE raw SET state = 'done' WHERE message_id = ?", [(i,) for i in ids]
            )
            db.executemany(
                "INSERT INTO raw (message_id, recipient_host, state, payload) "
                "VALUES (?, 'alpha', 'reply', '{}')",
                [(f"r-{i}",) for i in ids],
            )
            db.execute("COMMIT")
            if ids:
                reply_bell.write_text(ids[-1])

    try:
        _watch(directory, "request", respond)
    finally:
        db.close()


def main(argv: list[str]) -> None:
    role, *args = argv
    if role in ("uds-echo", "uds-forward", "uds-sink"):
        asyncio.run(_serve_uds(args[0], role, args[1] if role == "uds-forward" else None))
    elif role == "pg-listen":
        _pg_listen(*args)
    elif role == "pg-respond":
        _pg_respond(*args)
    elif role == "bell-watch":
        _watch(args[0], args[1], _arrived)
    elif role == "bell-respond":
        _bell_respond(*args)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
