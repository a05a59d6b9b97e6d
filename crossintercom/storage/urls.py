"""Store URLs: which backend a URL names, and how to show it without its password."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from crossintercom.errors import StoreURLError

POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg")
SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")

# scheme://user:password@host...: the password runs to the LAST "@" of the URL, so one that
# holds "@" or ":" (written without percent-encoding) is masked whole.
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/]*):(?P<pw>.*)@")
_QUERY_PASSWORD = re.compile(r"(password=)[^&\s]*", re.IGNORECASE)
# Kept as they are when a password is percent-encoded: its own escapes, and what RFC 3986 allows.
_USERINFO_SAFE = "%!$&'()*+,;=-._~"


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***``; safe to print or log."""
    masked = _USERINFO.sub(r"\g<scheme>\g<user>:***@", url, count=1)
    return _QUERY_PASSWORD.sub(r"\1***", masked)


def _encode_userinfo(raw: str) -> str:
    """Percent-encode a password written raw, so ``user:p@ss:w0rd@host`` means what a person
    meant: the password runs to the last "@" (the parser alone would stop at the first)."""
    m = _USERINFO.match(raw)
    if m is None:
        return raw
    pw = quote(m["pw"], safe=_USERINFO_SAFE)
    return f"{m['scheme']}{m['user']}:{pw}@{raw[m.end() :]}"


@dataclass(frozen=True, slots=True)
class StoreURL:
    kind: Literal["postgres", "sqlite"]
    url: URL  # the SQLAlchemy URL, driver made explicit
    masked: str
    path: Path | None = None  # the database file, for SQLite

    def libpq_conninfo(self) -> str:
        """The URL as libpq reads it, for the dedicated listener connection."""
        return self.url.set(drivername="postgresql").render_as_string(hide_password=False)


def parse_store_url(raw: str) -> StoreURL:
    """Pick the backend from the URL scheme alone; anything else is refused up front."""
    masked = mask_url(raw)
    try:
        url = make_url(_encode_userinfo(raw))
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StoreURLError(
            f"cannot parse store URL {masked}; use postgresql://USER@HOST/DB or sqlite:///PATH"
        ) from None
    if url.drivername in POSTGRES_SCHEMES:
        if not url.database:
            raise StoreURLError(f"store URL {masked} names no database; add /DBNAME")
        return StoreURL("postgres", url.set(drivername="postgresql+psycopg"), masked)
    if url.drivername in SQLITE_SCHEMES:
        if not url.database or url.database == ":memory:":
            raise StoreURLError(
                f"store URL {masked} names no file; a shared store needs sqlite:///PATH"
            )
        path = Path(url.database).expanduser().absolute()
        return StoreURL("sqlite", url.set(drivername="sqlite", database=str(path)), masked, path)
    raise StoreURLError(
        f"unsupported store URL scheme {url.drivername!r} in {masked}; "
        "use postgresql://USER@HOST/DB or sqlite:///PATH"
    )


def with_password_file(raw: str, password_file: str | None) -> str:
    """``raw`` with the password read from ``password_file`` (when given), kept in memory only.

    So a relay or ``db upgrade`` needs no password on its command line, where other users can
    read it (docs/operations.md). Without a file, libpq's own ``PGPASSWORD`` and ``~/.pgpass``
    still apply to a URL that has no password.
    """
    if not password_file:
        return raw
    try:
        password = Path(password_file).expanduser().read_text().rstrip("\r\n")
    except OSError as exc:
        raise StoreURLError(
            f"cannot read the store password file {password_file}: {exc.strerror}"
        ) from None
    if not password:
        raise StoreURLError(f"the store password file {password_file} is empty")
    parsed = parse_store_url(raw)
    if parsed.kind != "postgres":
        raise StoreURLError(
            f"a password file applies to a postgresql:// store, not {parsed.masked}"
        )
    url = make_url(raw).set(password=password)
    return url.render_as_string(hide_password=False)
