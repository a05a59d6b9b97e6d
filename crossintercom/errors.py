"""One base exception; every error carries a stable ``code``.

A subclass's docstring is its default message, so raising ``StoreUnavailable()`` reads well
without repeating text at every raise site.
"""

from __future__ import annotations

from typing import Any, ClassVar

from crossintercom.codes import Code

# ``Code`` is re-exported: ``errors.Code`` is the name the package uses (codes.py sits below
# models, which may not import this module).
__all__ = [
    "AuthorityError",
    "BrokerStateTooNew",
    "BrokerUnavailable",
    "Code",
    "ConfigError",
    "CrossintercomError",
    "Disconnected",
    "InboxUnavailable",
    "MessageTooLarge",
    "NotOneLine",
    "PayloadConflict",
    "ProtocolError",
    "RemoteError",
    "RuntimeDirError",
    "SchemaMissing",
    "SchemaOutdated",
    "SchemaTooNew",
    "StoreError",
    "StoreFenced",
    "StoreInDoubt",
    "StoreReadOnly",
    "StoreURLError",
    "StoreUnavailable",
    "UsageError",
]


class CrossintercomError(Exception):
    """crossintercom failed."""

    code: ClassVar[str] = Code.ERROR
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

    code = Code.INVALID_ARGUMENT
    exit_code = 2


class NotOneLine(UsageError):
    """A field that must be one line holds a line break or a control character."""

    code = Code.NOT_ONE_LINE


class ConfigError(CrossintercomError):
    """Invalid configuration."""

    code = Code.INVALID_CONFIG


class RuntimeDirError(CrossintercomError):
    """The runtime directory cannot be used."""

    code = Code.RUNTIME_DIR


class BrokerStateTooNew(RuntimeDirError):
    """The runtime dir's broker.sqlite was written by a newer crossintercom; nothing was
    changed in it (local_broker/state/schema.py)."""

    code = Code.SCHEMA_TOO_NEW


class ProtocolError(CrossintercomError):
    """Malformed frame."""

    code = Code.BAD_FRAME

    def __init__(self, message: str | None = None, *, code: Code | None = None, **details: Any):
        super().__init__(message, **details)
        if code is not None:
            self.code = code  # type: ignore[misc]


class BrokerUnavailable(CrossintercomError):
    """The local broker is not reachable."""

    code = Code.BROKER_UNAVAILABLE


class Disconnected(CrossintercomError):
    """The connection to the broker was lost."""

    code = Code.DISCONNECTED


class RemoteError(CrossintercomError):
    """The broker answered with an error frame."""

    # ``code`` as received: a newer broker may send a code this version does not list.
    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code  # type: ignore[misc]


class InboxUnavailable(CrossintercomError):
    """The session's inbox cannot be read or written right now (a full disk or a read-only
    inbox); nothing was lost, and it is retried until it can."""

    code = Code.INBOX_UNAVAILABLE


class AuthorityError(CrossintercomError):
    """The dedup authority files are unusable; run `crossintercom broker --reset-authority`."""

    code = Code.AUTHORITY_CORRUPT


class StoreError(CrossintercomError):
    """The shared store failed."""

    code = Code.STORE_ERROR


class QuotaExceeded(StoreError):
    """A reserve past its session's or host's reservation quota: nothing was reserved."""

    code = Code.RESERVATION_QUOTA


class StoreUnavailable(StoreError):
    """The shared store is not reachable."""

    code = Code.STORE_UNAVAILABLE


class StoreURLError(StoreError):
    """Unsupported store URL; use postgresql://… or sqlite:///path."""

    code = Code.BAD_STORE_URL


class SchemaMissing(StoreError):
    """The store has no crossintercom schema; run `crossintercom db upgrade`."""

    code = Code.SCHEMA_MISSING


class SchemaTooNew(StoreError):
    """The store's schema is newer than this crossintercom; upgrade crossintercom."""

    code = Code.SCHEMA_TOO_NEW


class SchemaDamaged(StoreError):
    """A table or column the schema defines is gone, renamed or a view (a writer of a SQLite
    file changed it after migration); nothing was written."""


class SchemaOutdated(StoreError):
    """The store's schema is older than this crossintercom; run `crossintercom db upgrade`."""

    code = Code.SCHEMA_OUTDATED


class PayloadConflict(StoreError):
    """The same message id was already used with a different payload."""

    code = Code.PAYLOAD_CONFLICT


class MessageTooLarge(StoreError):
    """The message exceeds the store's size limit."""

    code = Code.TOO_LARGE


class StoreInDoubt(StoreError):
    """The connection to the store was lost during COMMIT; the write may or may not have landed.

    Resolve it by enqueueing the same items again after reconnecting (relay/outbound.py).
    """

    code = Code.STORE_IN_DOUBT


class StoreFenced(StoreError):
    """A newer relay took over this host id; the write was refused and nothing was written."""

    code = Code.STORE_FENCED


class StoreReadOnly(StoreError):
    """The store cannot be written: check the file and directory permissions."""

    code = Code.STORE_READ_ONLY


class StoreLocksUnsafe(StoreError):
    """The SQLite store's filesystem does not keep writers on different hosts apart; nothing
    was written (storage/lockcheck.py)."""

    code = Code.STORE_LOCKS_UNSAFE
