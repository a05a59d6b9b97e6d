"""A TCP forwarder put between a client (a relay) and a server (PostgreSQL) by `crossintercom
chaos` and the fault tests, with the faults they need: hold traffic (blackhole), cut every
connection with a reset, and cut a client at the moment it sends a given byte pattern (a COMMIT)
while that write still reaches the server a little later, so the client cannot know whether it
landed.

Self-contained (threads and sockets only), loopback only, and everything it opened is closed by
``close``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Self

_CHUNK = 65536


@dataclass
class _Pair:
    client: socket.socket
    server: socket.socket
    closed: threading.Event = field(default_factory=threading.Event)
    # The client wrote the ``after`` pattern of an armed ``cut_after`` on this connection.
    primed: bool = False
    # Bytes were thrown away by a dropping blackhole: the stream is broken for good.
    dropped: bool = False

    def close(self, *, reset: bool = True) -> None:
        self.closed.set()
        for s in (self.client, self.server):
            _drop(s, reset=reset)


def _drop(s: socket.socket, *, reset: bool) -> None:
    """End one side now. shutdown() first: a plain close() while the other pump thread is in
    recv() on the same socket would leave the connection open until that recv returns."""
    with contextlib.suppress(OSError):
        if reset:
            # SO_LINGER 0: the peer gets RST, as from a dropped NAT entry or a dead host.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()


class TcpProxy:
    """Listens on 127.0.0.1:<port> and forwards each connection to ``target``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._dropping = False
        self._stopping = threading.Event()
        # One-shot: (pattern, the pattern that must come first on the same connection, how long
        # the matching write is held, whether it reaches the server at all).
        self._cut_on: tuple[bytes, bytes, float, bool] | None = None
        self.cuts_on_pattern = 0
        self.connections = 0
        self._threads: list[threading.Thread] = []
        self._start(self._accept_loop)

    def _start(self, target: object, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        t.start()
        self._threads.append(t)

    # --- controls --------------------------------------------------------------------------------

    def blackhole(self, *, drop: bool = False) -> None:
        """Hold all traffic, both ways, on every connection (nothing is dropped or closed).
        ``drop``: throw it away instead; bytes are still accepted (the kernel acknowledges
        them, so keepalives and the TCP user timeout see a live peer) but never forwarded."""
        if drop:
            self._dropping = True
        else:
            self._flowing.clear()

    def resume(self) -> int:
        """Forward again. Connections that lost bytes to a dropping blackhole are broken
        streams: they are reset (returns how many)."""
        self._dropping = False
        self._flowing.set()
        with self._lock:
            broken = [p for p in self._pairs if p.dropped]
            self._pairs = [p for p in self._pairs if not p.dropped]
        for pair in broken:
            pair.close()
        return len(broken)

    def cut(self) -> int:
        """Reset every open connection; returns how many were cut. New ones are accepted."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()
        return len(pairs)

    def cut_after(
        self, pattern: bytes, *, after: bytes = b"", hold_s: float = 0.0, deliver: bool = True
    ) -> None:
        """Arm once: the next client write containing ``pattern`` (on a connection that wrote
        ``after`` before it) cuts that client at once; the write itself reaches the server
        ``hold_s`` seconds later (or never, if not ``deliver``), then the server side is closed
        too. The client sees its connection die right after sending the write."""
        with self._lock:
            self._cut_on = (pattern, after, hold_s, deliver)

    # --- forwarding -------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
                self.connections += 1
            self._start(self._pump, pair, True)
            self._start(self._pump, pair, False)

    def _take_cut(self, pair: _Pair, data: bytes) -> tuple[float, bool] | None:
        with self._lock:
            if self._cut_on is None:
                return None
            pattern, after, hold, deliver = self._cut_on
            if pattern in data and (pair.primed or not after):
                self._cut_on = None
                self.cuts_on_pattern += 1
                return hold, deliver
            if after and after in data:
                pair.primed = True
        return None

    def _pump(self, pair: _Pair, upstream: bool) -> None:
        src, dst = (pair.client, pair.server) if upstream else (pair.server, pair.client)
        while not pair.closed.is_set():
            try:
                data = src.recv(_CHUNK)
            except OSError:
                break
            if not data:
                break
            if self._dropping:
                pair.dropped = True
                continue
            while not self._flowing.wait(0.1):
                if pair.closed.is_set() or self._stopping.is_set():
                    return
            if upstream:
                cut = self._take_cut(pair, data)
                if cut is not None:
                    self._deliver_late(pair, data, *cut)
                    return
            try:
                dst.sendall(data)
            except OSError:
                break
        pair.close(reset=False)

    def _deliver_late(self, pair: _Pair, data: bytes, hold_s: float, deliver: bool) -> None:
        pair.closed.set()
        _drop(pair.client, reset=True)
        time.sleep(hold_s)
        if deliver:
            with contextlib.suppress(OSError):
                pair.server.sendall(data)
        # Give the server a moment to read the write before it sees the connection end.
        time.sleep(0.2)
        _drop(pair.server, reset=False)

    def close(self) -> None:
        self._stopping.set()
        self._flowing.set()
        with contextlib.suppress(OSError):
            # close() alone does not wake the accept() blocked in the accept thread; shutdown does.
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()
        for t in self._threads:
            t.join(2)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
