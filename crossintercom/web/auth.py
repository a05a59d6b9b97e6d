"""Who may use the overseer page: a random token, a CSRF token, and a Host check.

- Every request carries the access token: the ``ci_token`` cookie (set when the page is first
  opened with ``?token=``), or ``Authorization: Bearer``. The token is printed at start and
  written to ``web.token`` (0600) in the runtime dir; it is compared in constant time. It and
  the CSRF token are derived from ``web.key`` (0600, kept across runs), so a restarted page
  keeps both and open tabs carry on; deleting the key gives new ones.
- The cookie is named for the port (``ci_token_8765``): browsers send a host's cookies to all
  its ports, and two pages on two ports must not replace each other's. It is ``HttpOnly`` and
  ``SameSite=Strict``, so another site cannot ride on it; on top,
  every state-changing request must send the page's CSRF token in ``X-CSRF-Token`` and, when the
  browser says where it comes from (``Origin``), come from this page's own origin.
- The ``Host`` header must name this server (loopback names or the listen address), so a DNS
  rebinding page cannot talk to it under a name of its own.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from crossintercom.errors import CrossintercomError
from crossintercom.runtime import WEB_KEY_FILE, WEB_TOKEN_FILE, open_file, replace_file

COOKIE = "ci_token"
CSRF_HEADER = "x-csrf-token"
TOKEN_FILE = WEB_TOKEN_FILE


def _same(candidate: str | None, secret: str) -> bool:
    """In constant time, whatever the candidate holds (``compare_digest`` refuses non-ASCII
    strings with an exception: compared as bytes)."""
    if candidate is None:
        return False
    return hmac.compare_digest(candidate.encode("utf-8", "surrogatepass"), secret.encode())


@dataclass(frozen=True)
class Guard:
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    hosts: frozenset[str] = frozenset()
    cookie: str = COOKIE

    @classmethod
    def from_key(cls, key: bytes, hosts: frozenset[str], port: int | None = None) -> Guard:
        return cls(
            token=_derive(key, b"token"),
            csrf=_derive(key, b"csrf"),
            hosts=hosts,
            cookie=COOKIE if port is None else f"{COOKIE}_{port}",
        )

    def token_ok(self, candidate: str | None) -> bool:
        return _same(candidate, self.token)

    def csrf_ok(self, candidate: str | None) -> bool:
        return _same(candidate, self.csrf)

    def host_ok(self, host_header: str | None) -> bool:
        return host_header is not None and host_header.lower() in self.hosts

    def origin_ok(self, origin: str | None) -> bool:
        """A missing Origin is allowed (the CSRF token still is required); a present one must
        be this server."""
        if origin is None:
            return True
        for scheme in ("http://", "https://"):
            if origin.startswith(scheme):
                return origin[len(scheme) :].lower() in self.hosts
        return False


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    names = {host, "127.0.0.1", "localhost", "[::1]"} if _loopback(host) else {host}
    return frozenset(f"{n}:{port}".lower() for n in names)


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1", "[::1]") or host.startswith("127.")


def write_token_file(directory: Path, token: str) -> Path:
    """``web.token`` in the runtime dir, readable by its owner only (also in a group runtime
    dir, whose re-moding leaves it so), replaced atomically through a temporary file no one
    else can have placed or opened (runtime.replace_file)."""
    path = directory / TOKEN_FILE
    replace_file(path, (token + "\n").encode(), 0o600)
    return path


def _derive(key: bytes, what: bytes) -> str:
    digest = hmac.new(key, b"crossintercom overseer page " + what, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def load_key(directory: Path) -> bytes:
    """The page's key from ``web.key``, made (32 random bytes, 0600) when it is missing or not
    a plain private file of this user's: then the page gets a new token."""
    path = directory / WEB_KEY_FILE
    try:
        fd = open_file(path, os.O_RDONLY)
    except (OSError, CrossintercomError):
        fd = None
    if fd is not None:
        try:
            private = os.fstat(fd).st_mode & 0o077 == 0
            raw = os.read(fd, 200).strip()
        finally:
            os.close(fd)
        with contextlib.suppress(ValueError):
            key = bytes.fromhex(raw.decode())
            if private and len(key) == 32:
                return key
    key = secrets.token_bytes(32)
    replace_file(path, key.hex().encode() + b"\n", 0o600)
    return key
