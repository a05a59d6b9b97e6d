"""The shared store's schema: SQLAlchemy Core tables, the single source the migrations match.

Every row names the host that owns it (``messages.sender_host``, ``deliveries.recipient_host``,
``receipts.sender_host``, ``roster.host_id``) so per-host roles and row-level security can be
layered on later without reshaping the data.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from crossintercom.models import ACK_NOTE_CHARS, DELIVERY_STATES

# Deterministic constraint names keep migrations and batch mode (SQLite) reproducible.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigSerial = BigInteger().with_variant(Integer(), "sqlite")

# The most an Integer column holds (PostgreSQL's integer; SQLite keeps more, read back as is).
INTEGER_MAX = 2**31 - 1
HOST_ID_CHARS = 255
HOST_ID = String(HOST_ID_CHARS)
SESSION_ID = String(64)
MESSAGE_ID = String(128)
# A host's version and its relay's last error (hosts), as long as they may be.
VERSION_CHARS = 64
ERROR_CODE_CHARS = 64
ERROR_CHARS = 200

# The CHECK below holds a row to the states the code knows (models.DELIVERY_STATES).
QUEUED = text("state = 'queued'")
FINISHED = text("state <> 'queued'")

hosts = Table(
    "hosts",
    metadata,
    Column("host_id", HOST_ID, primary_key=True),
    # Bumped by every relay start; reads and writes of an older generation are fenced out.
    Column("generation", BigInteger, nullable=False),
    # A counter, not a timestamp: observers judge liveness on their own monotonic clock.
    Column("heartbeat", BigInteger, nullable=False),
    # Which machine's relay holds the current generation, so that two machines configured
    # with one host id are told so instead of fencing each other in turn.
    Column("machine", String(255)),
    # Bumped by every roster change of the host, so other relays re-read rosters only then.
    Column("roster_rev", BigInteger, nullable=False, server_default="0"),
    # When the heartbeat last moved, by the database's clock: set by a trigger (storage/schema),
    # never by a host; read by people (the page's "dead since"), never to judge a lease.
    Column("beat_at", DateTime(timezone=True)),
    # Written by the host's relay into its own row, read by `status --all-hosts` as another
    # host's words (checked in storage/rowcheck.py): its version at each claim, and its last
    # error (a code, a one-line message) when that changes, with the database's time.
    Column("version", String(VERSION_CHARS)),
    Column("last_error_code", String(ERROR_CODE_CHARS)),
    Column("last_error", String(ERROR_CHARS)),
    Column("last_error_at", DateTime(timezone=True)),
)

roster = Table(
    "roster",
    metadata,
    Column("host_id", HOST_ID, ForeignKey("hosts.host_id"), primary_key=True),
    Column("session_id", SESSION_ID, primary_key=True),
    Column("name", String(64)),
    Column("cwd", Text),
    Column("model", Text),
    Column("status", Text),
    Column("purpose", String(16), nullable=False),
    Column("groups", JSON, nullable=False),
    Column("durable", Boolean, nullable=False),
    Column("online", Boolean, nullable=False),
    # The session's wake policy (every / asks / never); NULL is 'every'.
    Column("wake", String(16)),
    # A session id belongs to one host: the first claim wins (docs/operations.md, "Trust model").
    Index("uq_roster_session_id", "session_id", unique=True),
)

messages = Table(
    "messages",
    metadata,
    Column("message_id", MESSAGE_ID, primary_key=True),
    Column("sender_host", HOST_ID, nullable=False),
    Column("digest", String(64), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("size", Integer, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
    Index("ix_messages_sender_host", "sender_host"),
)

deliveries = Table(
    "deliveries",
    metadata,
    Column("seq", BigSerial, primary_key=True, autoincrement=True),
    Column("message_id", MESSAGE_ID, ForeignKey("messages.message_id"), nullable=False),
    Column("recipient_host", HOST_ID, nullable=False),
    Column("recipient_session", SESSION_ID, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", String(64)),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    UniqueConstraint("message_id", "recipient_session"),
    CheckConstraint(
        "state IN ({})".format(", ".join(f"'{s}'" for s in DELIVERY_STATES)), name="state_valid"
    ),
    # Hot query of every relay: its host's queued rows in seq order.
    Index(
        "ix_deliveries_inbound",
        "recipient_host",
        "seq",
        postgresql_where=QUEUED,
        sqlite_where=QUEUED,
    ),
    Index("ix_deliveries_expiry", "expires_at", postgresql_where=QUEUED, sqlite_where=QUEUED),
    Index("ix_deliveries_purge", "finished_at", postgresql_where=FINISHED, sqlite_where=FINISHED),
)

receipts = Table(
    "receipts",
    metadata,
    Column("id", BigSerial, primary_key=True, autoincrement=True),
    Column("sender_host", HOST_ID, nullable=False),
    Column("message_id", MESSAGE_ID, nullable=False),
    Column("recipient_session", SESSION_ID, nullable=False),
    Column("recipient_host", HOST_ID, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("code", String(64)),
    Column("created", DateTime(timezone=True), nullable=False),
    # Set by receipts a recipient's host writes after the ack (``shown``, a late ``expired``):
    # the session on the sender's host to tell. NULL on delivery receipts.
    Column("sender_session", SESSION_ID),
    # An ``acknowledged`` receipt's note (docs/delivery.md#acknowledgement): text another host
    # wrote, shown to the sender only through safetext. NULL on every other receipt.
    Column("note", String(ACK_NOTE_CHARS)),
    Index("ix_receipts_sender", "sender_host", "id"),
    Index("ix_receipts_created", "created"),
)

settings = Table(
    "settings",
    metadata,
    # A single row; the check keeps it single.
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("max_message_bytes", Integer, nullable=False),
    Column("retention_s", Integer, nullable=False),
    CheckConstraint("id = 1", name="single_row"),
)

# Which database role is which host's (`crossintercom db grant-host`); on PostgreSQL the
# row-level security policies (storage/schema/postgres.sql) read it (docs/operations.md).
host_roles = Table(
    "host_roles",
    metadata,
    Column("role_name", String(63), primary_key=True),
    Column("host_id", HOST_ID, nullable=False),
    UniqueConstraint("host_id"),
)

# Path reservations (docs/agents.md#path-reservations): a session's claim on a glob of a
# project's paths. A row counts while its TTL runs, its ``generation`` is its host's current one
# and that host's lease holds, and its session is on the roster; the holder's host writes and
# deletes it (on PostgreSQL, row security: storage/schema/postgres.sql). No UPDATE: renewing
# is a delete and an insert.
reservations = Table(
    "reservations",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("project", String(255), nullable=False),
    Column("glob", Text, nullable=False),
    Column("mode", String(16), nullable=False),
    Column("host_id", HOST_ID, nullable=False),
    Column("session_id", SESSION_ID, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("reason", Text),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    # With the host: a row another host planted for this session's id never stands in its way.
    UniqueConstraint("project", "host_id", "session_id", "glob"),
    CheckConstraint("mode IN ('exclusive', 'shared')", name="mode_valid"),
    Index("ix_reservations_host_id", "host_id", "session_id"),
)

DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
DEFAULT_RETENTION_S = 7 * 86400

# --- the archive (docs/archive.md): opt-in, store-wide, searchable history ----------------------

archive_settings = Table(
    "archive_settings",
    metadata,
    # A single row, like ``settings``; absent means the archive is off.
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("enabled", Boolean, nullable=False),
    Column("retention_s", Integer, nullable=False),
    CheckConstraint("id = 1", name="single_row"),
)

archive_messages = Table(
    "archive_messages",
    metadata,
    # An integer key the SQLite full-text index addresses rows by (FTS5 ``content_rowid``);
    # also the live feed's order.
    Column("seq", BigSerial, primary_key=True, autoincrement=True),
    Column("message_id", MESSAGE_ID, nullable=False, unique=True),
    Column("thread_id", MESSAGE_ID, nullable=False),
    Column("subject", Text),
    Column("sender_id", SESSION_ID, nullable=False),
    Column("sender_name", String(64)),
    Column("sender_host", HOST_ID, nullable=False),
    Column("target", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("reply_to", MESSAGE_ID),
    Column("expects_reply", Boolean, nullable=False),
    Column("sent_at", DateTime(timezone=True), nullable=False),
    Column("archived_at", DateTime(timezone=True), nullable=False),
    Column("payload", JSON, nullable=False),
    Index("ix_archive_messages_thread_id", "thread_id", "seq"),
    Index("ix_archive_messages_sender_host", "sender_host"),
    Index("ix_archive_messages_archived_at", "archived_at"),
)

archive_recipients = Table(
    "archive_recipients",
    metadata,
    Column("message_id", MESSAGE_ID, primary_key=True),
    Column("session_id", SESSION_ID, primary_key=True),
    Column("host_id", HOST_ID, nullable=False),
    Column("name", String(64)),
    # The best outcome a host that saw the message reported (delivered beats queued).
    Column("outcome", String(16), nullable=False),
    Column("code", String(64)),
    Index("ix_archive_recipients_host_id", "host_id"),
)

# The full-text indexes are made by the migration, per dialect, not from this metadata: a
# PostgreSQL GIN expression index over ``to_tsvector`` and a SQLite FTS5 virtual table (with
# its shadow tables and triggers), neither of which the other dialect can express. The
# migration-equals-metadata check leaves exactly these names out (docs/archive.md).
ARCHIVE_FTS_INDEX = "ix_archive_messages_fts"
ARCHIVE_FTS_TABLE = "archive_fts"
TS_CONFIG = "english"


def outside_metadata(name: str | None, type_: str) -> bool:
    """Objects the migration owns that the metadata cannot describe (see above)."""
    if name is None:
        return False
    if type_ == "table":
        return name == ARCHIVE_FTS_TABLE or name.startswith(ARCHIVE_FTS_TABLE + "_")
    return type_ == "index" and name == ARCHIVE_FTS_INDEX


def include_name(name: str | None, type_: str, _parents: object) -> bool:
    """Alembic's ``include_name`` hook: compare everything but ``outside_metadata``."""
    return not outside_metadata(name, type_)
