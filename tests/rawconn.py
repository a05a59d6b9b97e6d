"""A bare socket to the broker for tests that speak the wire protocol frame by frame (hostile
bytes, half frames, requests the client library would never send), and the broker's session
list read that way. Re-exported by tests/conftest.py."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import Any


class RawConn:
    """A bare socket to the broker: write any bytes, read length-prefixed frames."""

    def __init__(self, home: Path, timeout: float = 10) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(home / "broker.sock"))
        except OSError:
            self.sock.close()
            raise
        self._rid = 100

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_body(self, body: bytes) -> None:
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def send(self, frame: dict[str, Any]) -> None:
        self.send_body(json.dumps(frame).encode())

    def _exact(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    def recv(self) -> dict[str, Any] | None:
        """The next frame, or None when the broker closed the connection."""
        header = self._exact(4)
        if header is None:
            return None
        body = self._exact(struct.unpack(">I", header)[0])
        assert body is not None, "broker closed the connection mid-frame"
        frame: dict[str, Any] = json.loads(body)
        return frame

    def recv_type(self, *types: str) -> dict[str, Any]:
        """The next frame of one of ``types`` (deliveries and notices in between are skipped)."""
        while True:
            frame = self.recv()
            assert frame is not None, f"connection closed while waiting for {types}"
            if frame["type"] in types:
                return frame

    def request(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send with a fresh request_id and return the answer carrying that request_id."""
        self._rid += 1
        rid = self._rid
        self.send({**frame, "request_id": rid})
        while True:
            answer = self.recv()
            assert answer is not None, f"connection closed while waiting for {frame['type']}"
            if answer.get("request_id") == rid:
                return answer

    def register(self, session_id: str, **session: Any) -> dict[str, Any]:
        mode = session.pop("mode", "own")
        return self.request(
            {
                "type": "register",
                "protocol": 1,
                "session": {"id": session_id, **session},
                "mode": mode,
            }
        )


def sessions(home: Path, *, quiet: bool = False) -> list[dict[str, Any]] | None:
    """The broker's `list` answer over a raw socket (None if no broker answers and ``quiet``)."""
    try:
        with RawConn(home, timeout=5) as conn:
            result: list[dict[str, Any]] = conn.request({"type": "list"})["sessions"]
            return result
    except OSError:
        if quiet:
            return None
        raise
