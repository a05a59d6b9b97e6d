"""Raw same-host baseline: length-prefixed JSON frames echoed over a Unix socket by a thread."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from crossintercom.models import new_id
from crossintercom.tools.bench.workload import Counts, text

HEADER = struct.Struct(">I")


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
            "message": {"id": new_id(), "to": "sink0@alpha", "message": text(i)},
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
