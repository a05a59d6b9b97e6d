"""One frozen settings object built from defaults, ``config.json``, environment and options.

Precedence, lowest first: built-in defaults, ``$CROSSINTERCOM_HOME/config.json``, environment
variables, explicit keyword overrides (command-line options). Environment variables exist only
for settings that are safe to inherit (docs/operations.md): never targets, reply ids or ``--fresh``.
"""

from __future__ import annotations

import errno
import getpass
import json
import os
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from crossintercom.errors import ConfigError
from crossintercom.safetext import is_ignorable

ENV_HOME = "CROSSINTERCOM_HOME"
ENV_STORE = "CROSSINTERCOM_STORE"
# A file holding the store's password (docs/operations.md): never the password itself.
ENV_STORE_PASSWORD_FILE = "CROSSINTERCOM_STORE_PASSWORD_FILE"
# Files for TLS to a PostgreSQL store (docs/operations.md, "TLS"): the CA that signed the
# server's certificate, and this host's client certificate and key.
ENV_STORE_SSL_ROOT_CERT = "CROSSINTERCOM_STORE_SSL_ROOT_CERT"
ENV_STORE_SSL_CERT = "CROSSINTERCOM_STORE_SSL_CERT"
ENV_STORE_SSL_KEY = "CROSSINTERCOM_STORE_SSL_KEY"
ENV_HOST_ID = "CROSSINTERCOM_HOST_ID"
ENV_GROUP = "CROSSINTERCOM_GROUP"
ENV_AS = "CROSSINTERCOM_AS"
ENV_JSON = "CROSSINTERCOM_JSON"
ENV_DURABILITY = "CROSSINTERCOM_DURABILITY"
# A session away from any broker reaches one through a gateway (docs/agents.md#through-a-gateway).
ENV_GATEWAY = "CROSSINTERCOM_GATEWAY"
ENV_GATEWAY_TOKEN_FILE = "CROSSINTERCOM_GATEWAY_TOKEN_FILE"
ENV_GATEWAY_CA = "CROSSINTERCOM_GATEWAY_CA"
# Where the relay serves Prometheus metrics (ADDR:PORT; off unset), and how the long-running
# commands log: "text" or "json" (docs/operations.md, "Monitoring", "Logs").
ENV_METRICS = "CROSSINTERCOM_METRICS"
ENV_LOG_FORMAT = "CROSSINTERCOM_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
# What a commit to the host's own SQLite files (inboxes, dedup authority, broker state) survives
# (docs/operations.md): "normal" a process crash, "full" a power cut too (an fsync per commit).
DURABILITY_SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL"}


def synchronous_pragma(level: str) -> str:
    """The PRAGMA that sets ``level`` (one of ``DURABILITY_SYNCHRONOUS``'s values)."""
    if level not in DURABILITY_SYNCHRONOUS.values():
        raise ValueError(f"synchronous level must be NORMAL or FULL, got {level!r}")
    return f"PRAGMA synchronous={level}"


# AF_UNIX sun_path is 108 bytes on Linux including the terminating NUL.
MAX_SOCKET_PATH = 107


def default_host_id() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def valid_host_id(host_id: str) -> bool:
    return (
        0 < len(host_id) <= 255
        and host_id.isprintable()
        and not any(c.isspace() for c in host_id)
        and "/" not in host_id
        # Shown as nothing or as a blank, it would make one host read as another.
        and not any(is_ignorable(c) for c in host_id)
    )


@dataclass(frozen=True, slots=True)
class Settings:
    home: Path
    host_id: str
    store_url: str | None = None
    store_password_file: str | None = None
    store_ssl_root_cert: str | None = None
    store_ssl_cert: str | None = None
    store_ssl_key: str | None = None
    group: str | None = None
    # https://HOST:PORT of a gateway: clients use it instead of a local broker.
    gateway_url: str | None = None
    gateway_token_file: str | None = None
    gateway_ca_file: str | None = None
    max_frame_bytes: int = 8 * 1024 * 1024
    # How long the rest of a frame may take once its length arrived: a client that trickles
    # one in holds its memory meanwhile (docs/operations.md, "Timeouts").
    frame_body_s: float = 30.0
    max_message_bytes: int = 1024 * 1024
    idle_exit_s: float = 5.0
    ack_timeout_s: float = 10.0
    retention_s: float = 7 * 86400.0
    dedup_max_records: int = 10_000
    dedup_max_bytes: int = 64 * 1024 * 1024
    dedup_ttl_s: float = 720.0
    # How often the broker sweeps expired dedup records and queued messages (expiry receipts).
    sweep_interval_s: float = 30.0
    # Durable names idle this long are retired as by `forget`; 0: never (docs/agents.md).
    retire_idle_s: float = 0.0
    remote_ack_wait_s: float = 5.0
    lease_s: float = 15.0
    # How often the relay bumps its heartbeat (its one idle commit: lease_s / 3, so at most 0.2
    # commits per second); a lease under three of these is taken as three (docs/storage.md).
    # Every host of a store should use the same.
    heartbeat_s: float = 5.0
    # How often the relay looks for other sessions holding up the store (PostgreSQL: idle in a
    # transaction, or holding a lock relays wait behind; relay/stuck.py, docs/operations.md),
    # inside the next heartbeat's transaction; housekeeping_s likewise.
    stuck_check_s: float = 15.0
    max_in_flight: int = 1000
    # Bounds on files that would otherwise only grow (docs/operations.md, "Bounded files").
    inbox_max_entries: int = 10_000
    wal_max_bytes: int = 1024 * 1024
    # Finished store rows (delivered, refused, expired) are purged this long after they
    # finished; they answer a sender's retry of the same id, which ends within 11 minutes.
    purge_after_s: float = 3600.0
    housekeeping_s: float = 60.0
    # Per-sender rate limit (docs/agents.md#policy): at most this many messages per sender in
    # any window of rate_limit_window_s, checked by the sender's broker and again by the
    # recipient's for mail from other hosts.
    rate_limit_count: int = 300
    rate_limit_window_s: float = 60.0
    # Coordination requests (reserve, unreserve, inbound policy changes) per session in any
    # window of coord_rate_window_s (docs/agents.md#policy), and the reservation quotas
    # (docs/agents.md#path-reservations): per session and per host, live reservations and the
    # characters of their globs and reasons; a host reads each other host's first
    # reservation_max_per_host rows only.
    coord_rate_count: int = 120
    coord_rate_window_s: float = 60.0
    reservation_max_per_session: int = 200
    reservation_max_chars_per_session: int = 100_000
    reservation_max_per_host: int = 1000
    reservation_max_chars_per_host: int = 500_000
    # How many of one host's published sessions the others read (docs/operations.md).
    roster_max_per_host: int = 1000
    durability: str = "normal"
    metrics: str | None = None
    log_format: str = "text"

    @property
    def socket_path(self) -> Path:
        return self.home / "broker.sock"

    @property
    def inbox_dir(self) -> Path:
        return self.home / "inbox"

    @property
    def sqlite_synchronous(self) -> str:
        """The ``PRAGMA synchronous`` level for the host's own SQLite files."""
        return DURABILITY_SYNCHRONOUS[self.durability]

    def file(self, name: str) -> Path:
        return self.home / name


# Settings that name the store or files to reach it with: strings, from config.json too.
STORE_FILES = ("store_password_file", "store_ssl_root_cert", "store_ssl_cert", "store_ssl_key")
GATEWAY_SETTINGS = ("gateway_url", "gateway_token_file", "gateway_ca_file")
_STRINGS = {"store_url", *STORE_FILES, "host_id", "group", *GATEWAY_SETTINGS, "metrics"}
_CHOICES = {"durability", "log_format"}
_TUNABLES = {
    f.name: f.type for f in fields(Settings) if f.name not in {"home", *_CHOICES, *_STRINGS}
}


_KNOWN = {*_TUNABLES, *_STRINGS, *_CHOICES}


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build settings; raises ``ConfigError`` with a readable message on bad input."""
    env = os.environ if env is None else env
    home_raw = overrides.pop("home", None) or env.get(ENV_HOME) or "~/.crossintercom"
    home = Path(os.path.expanduser(str(home_raw)))
    if not home.is_absolute():
        home = Path.cwd() / home
    values: dict[str, Any] = {}
    cfg_path = home / CONFIG_FILE
    if os.path.lexists(cfg_path):
        values.update(_read_config(cfg_path))
    for key, var in (
        ("store_url", ENV_STORE),
        ("store_password_file", ENV_STORE_PASSWORD_FILE),
        ("store_ssl_root_cert", ENV_STORE_SSL_ROOT_CERT),
        ("store_ssl_cert", ENV_STORE_SSL_CERT),
        ("store_ssl_key", ENV_STORE_SSL_KEY),
        ("host_id", ENV_HOST_ID),
        ("group", ENV_GROUP),
        ("durability", ENV_DURABILITY),
        ("gateway_url", ENV_GATEWAY),
        ("gateway_token_file", ENV_GATEWAY_TOKEN_FILE),
        ("gateway_ca_file", ENV_GATEWAY_CA),
        ("metrics", ENV_METRICS),
        ("log_format", ENV_LOG_FORMAT),
    ):
        if env.get(var):
            values[key] = env[var]
    values.update({k: v for k, v in overrides.items() if v is not None})
    if values.get("durability", "normal") not in DURABILITY_SYNCHRONOUS:
        raise ConfigError(
            f"invalid durability {values['durability']!r}: use "
            + " or ".join(repr(k) for k in DURABILITY_SYNCHRONOUS)
        )
    if values.get("log_format", "text") not in LOG_FORMATS:
        raise ConfigError(
            f"invalid log format {values['log_format']!r}: use "
            + " or ".join(repr(k) for k in LOG_FORMATS)
        )
    host_id = values.pop("host_id", None) or default_host_id()
    if not valid_host_id(str(host_id)):
        raise ConfigError(
            f"invalid host id {host_id!r}: use 1-255 printable characters without spaces or '/'"
        )
    settings = Settings(home=home, host_id=str(host_id))
    try:
        return replace(settings, **values)
    except TypeError as exc:
        raise ConfigError(f"unknown setting: {exc}") from None


CONFIG_FILE = "config.json"
_CONFIG_MAX = 64 * 1024


def _config_text(path: Path) -> str:
    """config.json routes mail and names a password file, so in a runtime dir others may write
    to (a group dir) only a file its trusted owners wrote is read: never through a symlink,
    a regular file with one link, owned by this user, root or the dir's owner (who can replace
    any file of the dir anyway), and, when the dir is open to others, writable by its owner
    alone (docs/operations.md, "Files in the runtime dir")."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "{}"
    except OSError as exc:
        why = "it is a symlink" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"refusing to read {path}: {why}; remove it") from None
    try:
        why = _untrusted(os.fstat(fd), os.stat(path.parent))
        if why:
            raise ConfigError(f"refusing to read {path}: {why}; remove it or fix it")
        raw = os.read(fd, _CONFIG_MAX + 1)
    finally:
        os.close(fd)
    if len(raw) > _CONFIG_MAX:
        raise ConfigError(f"{path}: over {_CONFIG_MAX} bytes")
    return raw.decode()


def _untrusted(st: os.stat_result, dir_st: os.stat_result) -> str:
    """Why config.json is not to be read, or ''."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_nlink != 1:
        return "it is a hard link to another file"
    if st.st_uid not in {os.geteuid(), 0, dir_st.st_uid}:
        return f"it belongs to uid {st.st_uid}, not to you, root or the dir's owner"
    if dir_st.st_mode & 0o077 and st.st_mode & 0o022:
        return "others may write it (chmod go-w)"
    return ""


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(_config_text(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a JSON object")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _STRINGS:
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{path}: {key!r} must be a string")
            out[key] = value
        elif key in _CHOICES:
            if not isinstance(value, str):
                raise ConfigError(f"{path}: {key!r} must be a string")
            out[key] = value
        elif key in _TUNABLES:
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"{path}: {key!r} must be a positive number")
            out[key] = int(value) if _TUNABLES[key] in (int, "int") else float(value)
        else:
            raise ConfigError(
                f"{path}: unknown setting {key!r}; known: {', '.join(sorted(_KNOWN))}"
            )
    return out
