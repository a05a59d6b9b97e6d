"""The shared store's schema: SQLAlchemy Core tables, the single source the migrations match.

Every row names the host that owns it (``messages.sender_host``, ``deliveries.recipient_host``,
``receipts.sender_host``, ``roster.host_id``) so per-host roles and row-level security can be
layered on later without reshaping the data.
"""

from __future__ import annotations

from typing import get_args

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

from crossintercom.storage.interface import DeliveryState

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

HOST_ID = String(255)
SESSION_ID = String(64)
MESSAGE_ID = String(128)

# The CHECK below holds a row to the states the code knows (interface.DeliveryState).
DELIVERY_STATES: tuple[DeliveryState, ...] = get_args(DeliveryState)
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

DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
DEFAULT_RETENTION_S = 7 * 86400
