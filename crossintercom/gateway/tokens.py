"""The gateway's grants: which token acts as which name, until when (docs/operations.md#gateway).

A token is 32 random bytes, shown once by ``crossintercom gateway grant``; the file keeps only
its SHA-256, so reading the file gives no token. The file is this user's alone (0600, in the
runtime dir, written whole through a new file), whatever the runtime dir's group.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

from crossintercom.config import Settings
from crossintercom.errors import Code, RemoteError, UsageError
from crossintercom.models import NAME_RULE, valid_name
from crossintercom.runtime import ensure_runtime_dir, replace_file

TOKEN_PREFIX = "cig_"
FILE = "gateway-tokens.json"
MAX_FILE_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Grant:
    id: str
    name: str
    sha256: str
    created: float
    expires: float | None = None
    revoked: float | None = None

    def public(self) -> dict[str, Any]:
        """What `gateway list` shows: never the token, nor its hash."""
        out = asdict(self)
        del out["sha256"]
        return out


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Grants:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = settings.file(FILE)

    def load(self) -> list[Grant]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise UsageError(f"{self.path} must be this user's alone (mode 0600); not used")
            data = f.read(MAX_FILE_BYTES + 1)
        try:
            rows = json.loads(data)["grants"]
            return [Grant(**row) for row in rows]
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{self.path} cannot be read as grants: {exc}") from None

    def _save(self, grants: list[Grant]) -> None:
        ensure_runtime_dir(self.settings)
        data = json.dumps({"grants": [asdict(g) for g in grants]}, indent=1).encode()
        replace_file(self.path, data, 0o600)

    def grant(self, name: str, expires_s: float | None) -> tuple[Grant, str]:
        """A new grant for NAME and its token (the only time the token exists in the open)."""
        if not valid_name(name):
            raise UsageError(f"invalid name {name!r}: {NAME_RULE}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        grant = Grant(
            id="g-" + secrets.token_hex(6),
            name=name,
            sha256=digest(token),
            created=now,
            expires=now + expires_s if expires_s else None,
        )
        self._save([*self.load(), grant])
        return grant, token

    def revoke(self, which: str) -> list[Grant]:
        """Revoke the grant with this id, or every live grant of this name."""
        now = time.time()
        grants = self.load()
        hit = [g for g in grants if which in (g.id, g.name) and g.revoked is None]
        if not hit:
            raise UsageError(f"no live grant {which!r} (give a grant id or a name)")
        ids = {g.id for g in hit}
        self._save([Grant(**{**asdict(g), "revoked": now}) if g.id in ids else g for g in grants])
        return hit

    def check(self, token: str | None) -> Grant:
        """The live grant a token holds, or the refusal with its code."""
        if not token:
            raise RemoteError(Code.GATEWAY_NO_TOKEN, "no token: send Authorization: Bearer TOKEN")
        wanted = digest(token)
        found = None
        for g in self.load():
            # Every row compared in constant time: the time taken says nothing of a near miss.
            if hmac.compare_digest(g.sha256, wanted):
                found = g
        return self.live(found)

    def live(self, grant: Grant | None) -> Grant:
        if grant is None:
            raise RemoteError(Code.GATEWAY_TOKEN_UNKNOWN, "this token was never granted here")
        if grant.revoked is not None:
            raise RemoteError(Code.GATEWAY_TOKEN_REVOKED, f"grant {grant.id} was revoked")
        if grant.expires is not None and grant.expires <= time.time():
            raise RemoteError(Code.GATEWAY_TOKEN_EXPIRED, f"grant {grant.id} has expired")
        return grant

    def recheck(self, grant_id: str) -> Grant:
        """The grant as the file says now (revoked or expired since: the refusal)."""
        with contextlib.suppress(UsageError):
            return self.live(next((g for g in self.load() if g.id == grant_id), None))
        raise RemoteError(Code.GATEWAY_TOKEN_UNKNOWN, "the grants file cannot be read")
