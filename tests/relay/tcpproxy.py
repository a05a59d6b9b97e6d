"""A TCP proxy a test puts between a relay and PostgreSQL, which can blackhole its traffic:
bytes are still accepted (the kernel acknowledges them, so keepalives and the TCP user timeout
see a live peer) but never forwarded, and nothing comes back."""

from __future__ import annotations

import contextlib
import socket
import threading


class BlackholeProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.blackholed = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket, bool]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server, self.blackholed.is_set()))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self.blackholed.is_set():
                    dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def blackhole(self) -> None:
        with self._lock:
            self._pairs = [(c, s, True) for c, s, _ in self._pairs]
            self.blackholed.set()

    def restore(self) -> None:
        """Forward again. Connections that lost bytes meanwhile are broken streams: reset."""
        with self._lock:
            self.blackholed.clear()
            stale = [(c, s) for c, s, hit in self._pairs if hit]
            self._pairs = [p for p in self._pairs if not p[2]]
        for pair in stale:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.restore()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for c, s, _ in pairs:
            c.close()
            s.close()
