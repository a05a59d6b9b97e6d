"""Store URLs: which backend a URL names, and how to show it without its password.

A PostgreSQL URL may name several hosts as libpq takes them, ``postgresql://u@h1:p1,h2:p2/db``
(with ``target_session_attrs=read-write`` the connection goes to whichever is the primary
now, docs/operations.md "High availability"); the hosts are kept in the query
(``host=h1,h2&port=p1,p2``), the form SQLAlchemy's driver and libpq both read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from crossintercom.errors import StoreURLError

POSTGRES_SCHEMES = ("postgresql", "postgresql+psycopg")
SQLITE_SCHEMES = ("sqlite", "sqlite+pysqlite")

# scheme://user:password@host...: the password runs to the LAST "@" of the URL, so one that
# holds "@" or ":" (written without percent-encoding) is masked whole.
_USERINFO = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/]*):(?P<pw>.*)@", re.DOTALL
)
# What is shown of a URL that does not parse (a slip in its scheme: "postgresql:/",
# "postgresql//", none at all) is masked the same way; a libpq "password = ..." too.
_SLIPPED_USERINFO = re.compile(
    r"^(?P<scheme>(?:[A-Za-z][A-Za-z0-9+.-]*(?::/*|/+))?)(?P<user>[^:@/]*):(?!/)(?P<pw>.*)@",
    re.DOTALL,
)
_QUERY_PASSWORD = re.compile(r"(password\s*=\s*)[^&\s]*", re.IGNORECASE)
# Kept as they are when a password is percent-encoded: its own escapes, and what RFC 3986 allows.
_USERINFO_SAFE = "%!$&'()*+,;=-._~"
_USER_ONLY = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/]+)@")
# scheme://[userinfo@]h1[:p1],h2[:p2][/rest]: a libpq host list (an IPv6 host in brackets).
# The list ends the authority: a "," in a password (before its "@") is no host list.
_HOST_LIST = re.compile(
    r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://(?:[^/?#]*@)?)(?P<hosts>[^/?#@]*,[^/?#@]*)"
    r"(?P<tail>(?:[/?#].*)?)$",
    re.DOTALL,
)
_HOST_PORT = re.compile(r"^(?P<host>\[[^\]]*\]|[^:\[\]]*)(?::(?P<port>[^:]*))?$")


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***``; safe to print or log."""
    masked, found = _USERINFO.subn(r"\g<scheme>\g<user>:***@", url, count=1)
    if not found:
        masked = _SLIPPED_USERINFO.sub(r"\g<scheme>\g<user>:***@", url, count=1)
    return _QUERY_PASSWORD.sub(r"\1***", masked)


def _encode_userinfo(raw: str) -> str:
    """Percent-encode a password written raw, so ``user:p@ss:w0rd@host`` means what a person
    meant: the password runs to the last "@" (the parser alone would stop at the first)."""
    m = _USERINFO.match(raw)
    if m is None:
        return raw
    pw = quote(m["pw"], safe=_USERINFO_SAFE)
    return f"{m['scheme']}{m['user']}:{pw}@{raw[m.end() :]}"


def _fold_hosts(raw: str) -> str:
    """A libpq host list (``h1:p1,h2:p2``) moved into the query as ``host=h1,h2&port=p1,p2``;
    any other URL as it is. A host without a port gets the default port (an empty entry)."""
    m = _HOST_LIST.match(raw)
    if m is None:
        return raw
    hosts: list[str] = []
    ports: list[str] = []
    for item in m["hosts"].split(","):
        part = _HOST_PORT.match(item.strip())
        if part is None or not part["host"]:
            raise ValueError(f"bad host {item!r} in the host list")
        hosts.append(part["host"].strip("[]"))
        ports.append(part["port"] or "")
    path, _, query = m["tail"].partition("?")
    folded = f"host={','.join(hosts)}"
    if any(ports):
        folded += f"&port={','.join(ports)}"
    query = f"{query}&{folded}" if query else folded
    return f"{m['head']}{path or '/'}?{query}"


def _one(value: str | tuple[str, ...]) -> str:
    """A query value as libpq takes it: a repeated ``host=h:p`` becomes one list."""
    return value if isinstance(value, str) else ",".join(value)


@dataclass(frozen=True, slots=True)
class StoreURL:
    kind: Literal["postgres", "sqlite"]
    url: URL  # the SQLAlchemy URL, driver made explicit
    masked: str
    path: Path | None = None  # the database file, for SQLite

    def libpq_conninfo(self) -> str:
        """The URL as libpq reads it (every host of a host list), for the connections opened
        without SQLAlchemy: the listener, the relay's hot path."""
        params: dict[str, str | int | None] = dict(
            self.url.translate_connect_args(username="user", database="dbname")
        )
        query = {key: _one(value) for key, value in self.url.query.items()}
        if "host" in query and ":" in query["host"] and "port" not in query:
            # host=h1:p1&host=h2:p2 (SQLAlchemy's other spelling): libpq wants them apart.
            pairs = [item.rpartition(":") for item in query["host"].split(",")]
            query["host"] = ",".join(h if sep else p for h, sep, p in pairs)
            query["port"] = ",".join(p if sep else "" for _h, sep, p in pairs)
        params.update(query)
        return make_conninfo("", **params)

    @property
    def hosts(self) -> list[str]:
        """``host:port`` of each host the URL names, in order (one for most URLs)."""
        info = conninfo_hosts(self.libpq_conninfo())
        return [f"{h}:{p}" if p else h for h, p in info]


def parse_store_url(raw: str) -> StoreURL:
    """Pick the backend from the URL scheme alone; anything else is refused up front."""
    masked = mask_url(raw)
    try:
        url = make_url(_fold_hosts(_encode_userinfo(raw)))
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StoreURLError(
            f"cannot parse store URL {masked}; use postgresql://USER@HOST/DB or sqlite:///PATH"
        ) from None
    if url.drivername in POSTGRES_SCHEMES:
        if not url.database:
            raise StoreURLError(f"store URL {masked} names no database; add /DBNAME")
        url = url.set(drivername="postgresql+psycopg")
        hosts = url.query.get("host")
        several = not isinstance(hosts, str) or "," in hosts
        if hosts is not None and several and "target_session_attrs" not in url.query:
            # Several hosts are a replica set: the store is written, so it is the primary
            # that is wanted (libpq's default, "any", takes a standby listed first).
            url = url.update_query_dict({"target_session_attrs": "read-write"})
        parsed = StoreURL("postgres", url, masked)
        try:
            parsed.libpq_conninfo()  # an option libpq does not know, refused here, not later
        except psycopg.ProgrammingError as exc:
            reason = str(exc).strip().replace(url.password or "\0", "***")
            raise StoreURLError(f"store URL {masked}: {mask_url(reason)}") from None
        return parsed
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
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise StoreURLError(f"cannot read the store password file {password_file}: {why}") from None
    if not password:
        raise StoreURLError(f"the store password file {password_file} is empty")
    parsed = parse_store_url(raw)
    if parsed.kind != "postgres":
        raise StoreURLError(
            f"a password file applies to a postgresql:// store, not {parsed.masked}"
        )
    # Written into the URL as given, so what is shown of it (masked) is what the person wrote.
    m = _USERINFO.match(raw) or _USER_ONLY.match(raw)
    if m is not None:
        pw = quote(password, safe="")
        return f"{m['scheme']}{m['user']}:{pw}@{raw[m.end() :]}"
    url = make_url(_fold_hosts(raw)).set(password=password)
    return url.render_as_string(hide_password=False)


def conninfo_hosts(conninfo: str) -> list[tuple[str, str]]:
    """(host, port) of each host a libpq connection string names."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(conninfo)
    hosts = str(info.get("host") or "").split(",")
    ports = str(info.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return list(zip(hosts, ports, strict=False))
