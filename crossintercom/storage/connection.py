"""The store URL a process connects with: the configured URL plus the files its settings name
(the password file, the TLS CA, client certificate and key; docs/operations.md, "TLS").

The TLS files become libpq's ``sslrootcert``, ``sslcert`` and ``sslkey`` parameters of the URL,
so every connection made from it (the pool, the relay's hot path, the listener, migrations)
uses them. The query is edited as text, so a URL naming several hosts keeps its host list.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from crossintercom.config import Settings
from crossintercom.errors import StoreURLError
from crossintercom.storage.urls import mask_url, with_password_file

# Setting name -> libpq parameter and how the file is named in an error.
_TLS_FILES = (
    ("root_cert", "sslrootcert", "CA certificate"),
    ("cert", "sslcert", "client certificate"),
    ("key", "sslkey", "client key"),
)
# What libpq itself accepts for a private key: no access for others, and for the group at
# most read when root owns the file (a key shared with a service group).
_KEY_MODE_OWN = 0o077
_KEY_MODE_ROOT = 0o037
# libpq's and the server's words for a TLS set-up that does not fit the server: the CA, the
# server's name, the client certificate or its key. Waiting does not change them.
_TLS_REFUSALS = (
    "certificate verify failed",
    "does not match host name",
    "requires a valid client certificate",
    "certificate authentication failed",
    "private key file",
    "certificate file",
    "could not load",
    "does not support ssl",
)


def tls_refused(exc: BaseException) -> bool:
    """The connection failed on the TLS files or certificates, not on a server away."""
    text = str(exc).lower()
    return any(words in text for words in _TLS_REFUSALS)


def connection_url(settings: Settings) -> str | None:
    """``settings.store_url`` with its password file and TLS files applied; None without a
    store. Raises ``StoreURLError`` when a named file cannot be used."""
    if not settings.store_url:
        return None
    url = with_password_file(settings.store_url, settings.store_password_file)
    return with_tls_files(
        url,
        root_cert=settings.store_ssl_root_cert,
        cert=settings.store_ssl_cert,
        key=settings.store_ssl_key,
    )


def with_tls_files(
    raw: str, *, root_cert: str | None = None, cert: str | None = None, key: str | None = None
) -> str:
    """``raw`` with libpq's ``sslrootcert``/``sslcert``/``sslkey`` set to the given files
    (a setting wins over the same parameter written in the URL). A CA without an ``sslmode``
    in the URL means ``sslmode=verify-full``: naming a CA asks for the server to be checked."""
    given = {"root_cert": root_cert, "cert": cert, "key": key}
    if not any(given.values()):
        return raw
    if not raw.startswith("postgresql"):
        raise StoreURLError(f"TLS files apply to a postgresql:// store, not {mask_url(raw)}")
    if bool(cert) != bool(key):
        raise StoreURLError(
            "a client certificate and its key go together: set both store_ssl_cert and "
            "store_ssl_key (or neither)"
        )
    parts = urlsplit(raw)
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    for setting, param, what in _TLS_FILES:
        path = given[setting]
        if path:
            params[param] = _checked_file(path, what, private=setting == "key")
    if root_cert and "sslmode" not in params:
        params["sslmode"] = "verify-full"
    return urlunsplit(parts._replace(query=urlencode(params, safe="/")))


def _checked_file(path: str, what: str, *, private: bool) -> str:
    """The file's absolute path, after checking it can be read (and, for a key, that nobody
    else can): libpq's own refusal would come later, as a connection failure."""
    full = Path(path).expanduser().absolute()
    try:
        st = full.stat()
        with open(full, "rb"):
            pass
    except OSError as exc:
        raise StoreURLError(f"cannot read the store's {what} {full}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreURLError(f"the store's {what} {full} is not a regular file")
    if private:
        allowed = _KEY_MODE_ROOT if st.st_uid == 0 and os.geteuid() != 0 else _KEY_MODE_OWN
        if st.st_mode & allowed:
            raise StoreURLError(
                f"the store's {what} {full} is readable by others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); run chmod 600 on it"
            )
    return str(full)
