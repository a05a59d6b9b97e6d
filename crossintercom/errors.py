"""One base exception; every error carries a stable ``code``.

A subclass's docstring is its default message, so raising ``StoreUnavailable()`` reads well
without repeating text at every raise site.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar


class Code(StrEnum):
    """Every code that crosses a wire: error frames, refusals and receipts (docs/protocol.md).

    Codes are stable: scripts and agents branch on them. Add a code here before using it.
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
    RELAY_IN_USE = "relay_in_use"
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


class CrossintercomError(Exception):
    """crossintercom failed."""

    code: ClassVar[str] = "error"
    # CLI exit code when this error ends a command (1 = operational error; see README "Exit codes").
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.message = message or (self.__doc__ or self.code).strip()
        self.details = details
        super().__init__(self.message)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.details}


class UsageError(CrossintercomError):
    """Invalid argument."""

    code = "invalid_argument"
    exit_code = 2


class NotOneLine(UsageError):
    """A field that must be one line holds a line break or a control character."""

    code = "not_one_line"


class ConfigError(CrossintercomError):
    """Invalid configuration."""

    code = "invalid_config"


class RuntimeDirError(CrossintercomError):
    """The runtime directory cannot be used."""

    code = "runtime_dir"


class ProtocolError(CrossintercomError):
    """Malformed frame."""

    code = "bad_frame"

    def __init__(self, message: str | None = None, *, code: str | None = None, **details: Any):
        super().__init__(message, **details)
        if code is not None:
            self.code = code  # type: ignore[misc]


class BrokerUnavailable(CrossintercomError):
    """The local broker is not reachable."""

    code = "broker_unavailable"


class Disconnected(CrossintercomError):
    """The connection to the broker was lost."""

    code = "disconnected"


class RemoteError(CrossintercomError):
    """The broker answered with an error frame."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code  # type: ignore[misc]


class InboxUnavailable(CrossintercomError):
    """The session's inbox cannot be read or written right now (a full disk or a read-only
    inbox); nothing was lost, and it is retried until it can."""

    code = "inbox_unavailable"


class AuthorityError(CrossintercomError):
    """The dedup authority files are unusable; run `crossintercom broker --reset-authority`."""

    code = "authority_corrupt"


class StoreError(CrossintercomError):
    """The shared store failed."""

    code = "store_error"


class StoreUnavailable(StoreError):
    """The shared store is not reachable."""

    code = "store_unavailable"


class StoreURLError(StoreError):
    """Unsupported store URL; use postgresql://… or sqlite:///path."""

    code = "bad_store_url"


class SchemaMissing(StoreError):
    """The store has no crossintercom schema; run `crossintercom db upgrade`."""

    code = "schema_missing"


class SchemaTooNew(StoreError):
    """The store's schema is newer than this crossintercom; upgrade crossintercom."""

    code = "schema_too_new"


class SchemaOutdated(StoreError):
    """The store's schema is older than this crossintercom; run `crossintercom db upgrade`."""

    code = "schema_outdated"


class PayloadConflict(StoreError):
    """The same message id was already used with a different payload."""

    code = "payload_conflict"


class MessageTooLarge(StoreError):
    """The message exceeds the store's size limit."""

    code = "too_large"


class StoreInDoubt(StoreError):
    """The connection to the store was lost during COMMIT; the write may or may not have landed.

    Resolve it by enqueueing the same items again after reconnecting (relay/outbound.py).
    """

    code = "store_in_doubt"


class StoreFenced(StoreError):
    """A newer relay took over this host id; the write was refused and nothing was written."""

    code = "store_fenced"


class StoreReadOnly(StoreError):
    """The store cannot be written: check the file and directory permissions."""

    code = "store_read_only"
