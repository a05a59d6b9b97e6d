"""The one list of codes (docs/protocol.md#codes), below every other module so that ``models``,
``errors`` and the wire structs all name the same members."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Code(StrEnum):
    """Every code that crosses a wire or ends a command: error frames, refusals, receipts,
    store rows and the CLI's JSON errors (docs/protocol.md#codes).

    Codes are stable: scripts and agents branch on them. Add a code here before using it; the
    store's policies take every code of this list, written in by `db upgrade` (no migration:
    storage/schema). Outcomes are ``models.Outcome``, store row states ``models.State``:
    neither is a code.
    """

    # A frame that cannot be read (the connection stays open unless the byte stream broke).
    BAD_UTF8 = "bad_utf8"
    BAD_JSON = "bad_json"
    NOT_OBJECT = "not_object"
    MISSING_FIELD = "missing_field"
    BAD_FIELD = "bad_field"
    UNKNOWN_TYPE = "unknown_type"
    FRAME_TOO_LARGE = "frame_too_large"
    # A frame that is well formed but not allowed now, or from this connection.
    NOT_REGISTERED = "not_registered"
    ALREADY_REGISTERED = "already_registered"
    PROTOCOL_MISMATCH = "protocol_mismatch"
    INVALID_PURPOSE = "invalid_purpose"
    SESSION_IN_USE = "session_in_use"
    # A second relay connection to a broker that already has one (the broker's refusal).
    RELAY_ALREADY_CONNECTED = "relay_already_connected"
    NOT_AGENT = "not_agent"
    NOT_RELAY = "not_relay"
    # The connecting process's user is not the runtime dir's (nor of its group): SO_PEERCRED.
    PEER_NOT_ALLOWED = "peer_not_allowed"
    UNEXPECTED_ACK = "unexpected_ack"
    INTERNAL = "internal"
    # Refusals of a send, ask or reply.
    NOT_FOUND = "not_found"
    AMBIGUOUS = "ambiguous"
    MISSING_TARGET = "missing_target"
    GROUP_ASK = "group_ask"
    BAD_ATTACHMENT = "bad_attachment"
    TOO_LARGE = "too_large"
    PAYLOAD_CONFLICT = "payload_conflict"
    OVER_CAPACITY = "over_capacity"
    REPLY_NOT_AUTHORISED = "reply_not_authorised"
    ALREADY_REPLIED = "already_replied"
    # A second `resend` of one dead letter: it was sent again already (docs/delivery.md).
    ALREADY_RESENT = "already_resent"
    ASKER_GONE = "asker_gone"
    BAD_MESSAGE = "bad_message"
    # A field documented as one line (a subject, an attachment's name, a status) holds a line
    # break or a control character (docs/agents.md#framing).
    NOT_ONE_LINE = "not_one_line"
    # A store row whose sender is not one its writing host may use (docs/operations.md).
    FORGED_SENDER = "forged_sender"
    UNDELIVERABLE = "undeliverable"
    ID_CONFLICT = "id_conflict"
    REFUSED = "refused"
    EXPIRED = "expired"
    # A sender over its message rate (docs/agents.md#policy): loops between agents stop here.
    RATE_LIMITED = "rate_limited"
    # An ask to a session that is itself waiting on an ask to the asker: reply instead.
    CROSSING_ASK = "crossing_ask"
    # The expiry code of mail that was queued for a session `forget` dropped.
    FORGOTTEN = "forgotten"
    # The recipient's inbound policy refuses this sender (docs/agents.md#inbound-policy).
    SENDER_REFUSED = "sender_refused"
    # A path reservation another session's clashes with (docs/agents.md#path-reservations).
    RESERVATION_CONFLICT = "reservation_conflict"
    # A reserve that would take its session or host past its reservation quota (count or
    # characters; docs/agents.md#path-reservations).
    RESERVATION_QUOTA = "reservation_quota"
    # A session over its rate of coordination requests (reserve, unreserve, inbound policy
    # changes; docs/agents.md#policy).
    COORD_RATE_LIMITED = "coord_rate_limited"
    # Reservations live in the shared store: this host's relay must run to reserve or list them.
    RELAY_NOT_RUNNING = "relay_not_running"
    # Why nothing was sent (not_sent) or why the outcome is not known (unknown).
    NO_RELAY = "no_relay"
    RECIPIENT_GONE = "recipient_gone"
    # A host's own files (broker state, dedup records, an inbox) could not be written: a full or
    # read-only disk. Nothing was stored there; the message stays where it was (docs/delivery.md).
    LOCAL_STORAGE = "local_storage"
    # An ack's refusal: the client could not save the message to its inbox, so it was not
    # delivered; the broker keeps it queued (docs/delivery.md).
    SAVE_FAILED = "save_failed"
    # The session's inbox file cannot be read or written right now (a full disk, a read-only or
    # immutable file): a surface says so and retries; nothing was lost (docs/reliability.md).
    INBOX_UNAVAILABLE = "inbox_unavailable"
    STORE_UNAVAILABLE = "store_unavailable"
    STORE_IN_DOUBT = "store_in_doubt"
    BROKER_UNAVAILABLE = "broker_unavailable"
    DISCONNECTED = "disconnected"
    RELAY_LOST = "relay_lost"
    NO_ACK = "no_ack"
    UNCERTAIN = "uncertain"
    DEADLINE = "deadline"
    # Extra detail on a queued outcome: the recipient's host holds it for an away session.
    QUEUED_AT_HOST = "queued_at_host"
    # The same fact in the store: a delivery row acknowledged as taken into the recipient host's
    # durable queue (its state is ``delivered``; the sender is told ``queued_at_host``).
    HOST_QUEUED = "queued"
    # Why a command ended (errors.CrossintercomError and its subclasses): the CLI's JSON error.
    ERROR = "error"
    INVALID_ARGUMENT = "invalid_argument"
    INVALID_CONFIG = "invalid_config"
    RUNTIME_DIR = "runtime_dir"
    BAD_FRAME = "bad_frame"
    LOCK_HELD = "lock_held"
    AUTHORITY_CORRUPT = "authority_corrupt"
    AUTHORITY_UNAVAILABLE = "authority_unavailable"
    STORE_ERROR = "store_error"
    BAD_STORE_URL = "bad_store_url"
    SCHEMA_MISSING = "schema_missing"
    SCHEMA_TOO_NEW = "schema_too_new"
    SCHEMA_OUTDATED = "schema_outdated"
    STORE_FENCED = "store_fenced"
    STORE_READ_ONLY = "store_read_only"
    # A SQLite store whose filesystem's byte-range locks were shown not to exclude across
    # hosts: the relay writes nothing (storage/lockcheck.py, docs/operations.md).
    STORE_LOCKS_UNSAFE = "store_locks_unsafe"
    RELAY_ERROR = "relay_error"
    # `crossintercom relay` when another relay process runs for this host id on this machine
    # (its lock file is held); not the broker's RELAY_ALREADY_CONNECTED.
    RELAY_ALREADY_RUNNING = "relay_already_running"
    HOST_ID_COLLISION = "host_id_collision"
    RELAY_FENCED = "relay_fenced"
    INVALID_ESCALATION = "invalid_escalation"
    WAITER_BUSY = "waiter_busy"
    # `set-status` of a session no live client holds on this host: nothing to change.
    NOT_ONLINE = "not_online"
    # The MCP server: a call of a tool it does not offer.
    UNKNOWN_TOOL = "unknown_tool"
    # The overseer page's HTTP refusals (docs/web.md): a Host header it does not answer to, a
    # missing or wrong access token, a cross-site request.
    UNKNOWN_HOST = "unknown_host"
    BAD_TOKEN = "bad_token"
    CSRF = "csrf"
    # The gateway's refusals (docs/operations.md#gateway): no or an unknown token, one expired
    # or revoked, a request acting as another name than the token's, plain HTTP from another
    # machine, a frame a remote session may not send.
    GATEWAY_NO_TOKEN = "gateway_no_token"
    GATEWAY_TOKEN_UNKNOWN = "gateway_token_unknown"
    GATEWAY_TOKEN_EXPIRED = "gateway_token_expired"
    GATEWAY_TOKEN_REVOKED = "gateway_token_revoked"
    GATEWAY_WRONG_NAME = "gateway_wrong_name"
    GATEWAY_PLAIN_HTTP = "gateway_plain_http"
    GATEWAY_FORBIDDEN_FRAME = "gateway_forbidden_frame"
    # The gateway's certificate did not verify against the client's CA file (never retried).
    GATEWAY_UNTRUSTED = "gateway_untrusted"
    # `crossintercom chaos`: a send still open when the senders stopped (counted unknown).
    ABANDONED = "abandoned"


# Codes no longer written that a relay of an older version may still write during an upgrade:
# the store still accepts them in its rows (storage/schema.accepted_codes).
RETIRED_CODES: Final = ("relay_in_use",)
