"""The one store interface (``MailboxStore``, async), and the plain rows it returns. Both
backends implement it; the relay, the CLI (through ``storage.blocking``) and one behaviour
suite (tests/storage) run exactly the same operations.

Every state a row carries is a ``Literal``: what the store can hold, nothing a caller invents.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, Self

from crossintercom.errors import CrossintercomError
from crossintercom.models import (
    AckOutcome,
    DeliveryState,
    LateReceiptOutcome,
    ReceiptOutcome,
    SessionInfo,
)
from crossintercom.reservations import DEFAULT_QUOTAS, PER_HOST, READ_LIMIT, Held, Mode, Quotas
from crossintercom.storage.archive_types import ArchiveStore

# A delivery row's state, what a recipient's relay may acknowledge one as, what a receipt
# carries (the state its delivery finished in, or a later outcome its recipient's host wrote)
# and what that host reports after its ack: the one outcome model's (models.py).
# How reading back an enqueue whose COMMIT was in doubt can end without finding its row:
# "absent" (no row: the commit did not land, nothing was written) or "in_doubt" (the store
# stayed unreachable, so it is still unknown). A row that is found is an ``EnqueueResult``.
InDoubtResolution = Literal["absent", "in_doubt"]
# Told of every operation a store ran: its name (the store method's, from the code: a bounded
# metrics label), the seconds it took, and the error it ended in or None
# (``MailboxStore.observe``; the relay's metrics).
StoreObserver = Callable[[str, float, CrossintercomError | None], None]
# fetch_inbound reads a payload only up to this many characters unless told otherwise.
DEFAULT_MAX_PAYLOAD_CHARS = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Reserved:
    """A reserve's answer: the session's reservations of the project after it (none new when
    refused), and the other sessions' it clashed with (empty when it was made)."""

    held: list[Held]
    conflicts: list[Held]


@dataclass(frozen=True, slots=True)
class HostRow:
    host_id: str
    generation: int
    heartbeat: int
    # Bumped with every roster publish of the host: a roster is re-read only when it moved.
    roster_rev: int = 0
    # Seconds since the heartbeat last moved, by the database's clock (``hosts()`` only; None
    # until the trigger first stamped it): for people, never to judge a lease.
    beat_age_s: float | None = None
    # What the host wrote of itself (``hosts(reports=True)`` only).
    report: HostReport | None = None


@dataclass(frozen=True, slots=True)
class HostReport:
    """What a host's relay wrote into its own row: its crossintercom version (at its claim) and
    its last error (a code, a one-line message, its age by the database's clock). Another
    host's words: each is None when absent or when it failed its check (storage/rowcheck.py:
    not text, over its column's bound, not of its form), and ``unreadable`` names those that
    failed. Shown to people only, through crossintercom/safetext.py."""

    version: str | None = None
    error_code: str | None = None
    error: str | None = None
    error_age_s: float | None = None
    unreadable: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QueuedMail:
    """Mail waiting in the store for one host: how many deliveries, and the age of the oldest
    by the database's clock (None when a writer stored a time that does not parse)."""

    host_id: str
    count: int
    oldest_age_s: float | None


@dataclass(frozen=True, slots=True)
class StuckTransaction:
    """Another database session that holds up the store's writers: left idle inside a
    transaction holding locks on its tables (a frozen process, a client that forgot to
    commit), holding a table lock no relay takes (``LOCK TABLE``), or holding the migration
    lock. Fields PostgreSQL hides from a role without ``pg_read_all_stats`` are None."""

    pid: int
    user: str | None
    application: str | None
    client: str | None
    # Idle for (``idle``), else in its transaction for; None when hidden.
    idle_s: float | None
    # The store's tables it locks; ``MIGRATION_LOCK`` for the migration lock.
    tables: tuple[str, ...]
    # "idle" (idle in a transaction), "lock" (a table lock of its own asking).
    kind: str = "idle"


# How StuckTransaction.tables names the migration's advisory lock.
MIGRATION_LOCK = "the migration lock"


@dataclass(frozen=True, slots=True)
class OutboundItem:
    """One (message, recipient) pair to enqueue; a group message is several items, one id."""

    message_id: str
    sender_host: str
    recipient_host: str
    recipient_session: str
    digest: str
    payload: dict[str, Any]
    size: int


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """One enqueued item: the state of the delivery row it found or made, or ``refused`` with
    a ``code`` (``too_large``, ``payload_conflict``) when nothing was written for it."""

    message_id: str
    recipient_session: str
    state: DeliveryState
    inserted: bool
    code: str | None = None


@dataclass(frozen=True, slots=True)
class InDoubtEnqueue:
    """An item of an enqueue whose COMMIT was in doubt that reading back by id did not turn
    into a row: there is none (``absent``), or the store could not be read (``in_doubt``)."""

    message_id: str
    recipient_session: str
    resolution: InDoubtResolution


@dataclass(frozen=True, slots=True)
class MessageRow:
    message_id: str
    digest: str
    states: dict[str, DeliveryState]  # by recipient session


@dataclass(frozen=True, slots=True)
class InboundRow:
    """A queued delivery as stored. ``text`` is the payload's stored text, not decoded (anything
    a writer put there: the relay decodes it into a message once and, when it passes, hands
    the text itself over); ``None`` with ``payload_problem`` saying why when it is not UTF-8
    or is over the size the caller asked for."""

    seq: int
    message_id: str
    recipient_session: str
    text: str | None
    sender_host: str
    payload_problem: str | None = None
    # The digest the sender stored with the message: a receiver checks the payload against it.
    digest: str | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    message_id: str
    recipient_session: str
    outcome: AckOutcome
    code: str | None = None
    # The row's seq as read (the relay always gives it): the row is finished by it, on either
    # store (on SQLite a writer may have stored its key as a BLOB or as text that is not
    # UTF-8, which no key would match); without it, by key.
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    id: int
    message_id: str
    recipient_session: str
    recipient_host: str
    outcome: ReceiptOutcome
    code: str | None
    # Whom to tell on the sender's host, when the writer knew (late receipts).
    sender_session: str | None = None
    # An ``acknowledged`` receipt's note, as the recipient's host wrote it (untrusted text).
    note: str | None = None


@dataclass(frozen=True, slots=True)
class LateReceipt:
    """A receipt a recipient's host owes a sender's host after its ack: the message was shown
    to the recipient's agent, or expired in that host's own queue (or by ``forget``)."""

    message_id: str
    recipient_session: str
    sender_host: str
    sender_session: str
    outcome: LateReceiptOutcome
    code: str | None = None
    # ``acknowledged`` only: the recipient's one line for the sender.
    note: str | None = None


@dataclass(frozen=True, slots=True)
class StoreSettings:
    max_message_bytes: int = 1_048_576
    retention_s: int = 7 * 86400


@dataclass(frozen=True, slots=True)
class Wake:
    """What a wake-up says to look at: deliveries queued for the host, receipts for it (read
    them), receipts the hint carried itself (``hinted``: committed rows, resolved without a
    read; the rows stay the truth and are consumed later), and whether some host published a
    new roster. A catch-up wakes for all of them."""

    deliveries: bool = False
    receipts: bool = False
    hinted: tuple[ReceiptRow, ...] = ()
    roster: bool = False

    def __or__(self, other: Wake) -> Wake:
        return Wake(
            self.deliveries or other.deliveries,
            self.receipts or other.receipts,
            self.hinted + other.hinted,
            self.roster or other.roster,
        )


CATCH_UP = Wake(deliveries=True, receipts=True, roster=True)


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat's answer: every host's lease row with its roster revision (liveness and
    "has a roster changed" in the same read), whether rows wait for this host (the poll
    backstop, so a relay runs no query that would find nothing), and the archive setting."""

    hosts: tuple[HostRow, ...]
    deliveries_waiting: bool
    receipts_waiting: bool
    # The store-wide archive setting (docs/archive.md), so the archiver need not poll it;
    # None where the role may not read it (a per-host role).
    archive_enabled: bool | None = None
    # What each chore given to the beat returned, in order (``Chore``).
    chores: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Chore:
    """Periodic work run inside a heartbeat's own transaction, so an idle relay commits once
    per beat whatever else it looks after (docs/storage.md, "Idle load"): ``fn``, a body of the
    store's (a function of its SQLAlchemy connection), and ``after``, what to do once it
    committed (SQLite's doorbells)."""

    fn: Callable[[Any], Any]
    after: Callable[[], None] | None = None


class Waiter(Protocol):
    """Blocks until a wake-up hint arrives for one host, or a timeout passes.

    After ``wake`` returns a ``Wake``, the caller runs the queries it names. The first
    ``wake`` after entering (and after every reconnect) returns ``CATCH_UP`` at once, so the
    caller catches up on whatever arrived while nobody listened. ``wait`` is ``wake`` as a bool.
    """

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def wait(self, timeout: float) -> bool: ...

    def wake(self, timeout: float) -> Wake | None: ...

    def notify_self(self) -> None: ...


class MailboxStore(Protocol):
    """The shared mailbox. Every read-for-delivery, ack, receipt and roster write names the
    caller's generation and does nothing unless it is still its host's current one.

    Every operation is a coroutine, run on the event loop that opened the store (and only
    there: its pooled connections belong to it); blocking callers use ``storage.blocking``.
    """

    url_masked: str
    # The store's archive (docs/archive.md), on this store's driver and connection.
    archive: ArchiveStore

    async def aclose(self) -> None: ...

    async def check_schema(self) -> None: ...

    def observe(self, observer: StoreObserver | None) -> None:
        """Tell ``observer`` of every operation from now on (None: stop)."""
        ...

    async def trust_warnings(self) -> list[str]:
        """What undermines the store's trust boundary, one warning each (a SQLite file others
        may read, a trigger a writer installed); checked at relay start."""
        ...

    async def claim_host(
        self, host_id: str, machine: str | None = None, version: str | None = None
    ) -> int:
        """Take the next generation for ``host_id``, recording ``machine`` as its holder and
        ``version`` as the crossintercom it runs."""
        ...

    async def host_claim(self, host_id: str) -> tuple[str | None, int] | None:
        """(machine, heartbeat) of ``host_id``'s row; None when it has none."""
        ...

    async def queued_through(self, host_id: str) -> int:
        """The last seq still queued for ``host_id`` (0 when none)."""
        ...

    async def heartbeat(self, host_id: str, generation: int) -> bool: ...

    async def beat(
        self,
        host_id: str,
        generation: int,
        session_ids: Sequence[str],
        chores: Sequence[Chore] = (),
    ) -> Beat | None:
        """The heartbeat, answering with ``Beat`` (``session_ids``: whose queued rows count);
        None when ``generation`` is stale. ``chores`` run in the same transaction once the
        beat found the generation current; their results are ``Beat.chores``."""
        ...

    def stuck_chore(self, idle_s: float) -> Chore:
        """``stuck_transactions`` as a chore: a list of ``StuckTransaction``."""
        ...

    def expire_chore(self) -> Chore:
        """One batch of ``expire`` as a chore: how many rows expired (a full batch: more)."""
        ...

    def purge_chore(self, older_than_s: float, batch: int = 1000) -> Chore:
        """One batch of ``purge`` as a chore: (deliveries, receipts) deleted."""
        ...

    def sweep_chore(self, host_id: str, generation: int) -> Chore:
        """``sweep_reservations`` as a chore: how many went."""
        ...

    def counts_chore(self, host_id: str, generation: int) -> Chore:
        """What the relay's metrics count in the store, as a chore: (``queued_mail`` of
        ``host_id``, the host's live reservations at ``generation`` by mode, a mode with none
        absent); two grouped reads, no commit of their own."""
        ...

    async def hosts(self, *, reports: bool = False) -> list[HostRow]:
        """Every host's lease row; with ``reports``, what each wrote of itself too."""
        ...

    async def record_error(self, host_id: str, generation: int, code: str, error: str) -> bool:
        """Write the relay's last error into its row (fenced: False when ``generation`` is no
        longer current). ``error`` is one line of at most ``tables.ERROR_CHARS``."""
        ...

    async def queued_mail(self, host_id: str | None = None) -> list[QueuedMail]:
        """Mail waiting for ``host_id`` (every host when None; one grouped read)."""
        ...

    async def publish_sessions(
        self, host_id: str, generation: int, sessions: Sequence[SessionInfo]
    ) -> bool: ...

    async def roster(self, per_host: int = ...) -> list[SessionInfo]: ...

    async def enqueue(
        self, items: Sequence[OutboundItem], *, generation: int | None = None
    ) -> list[EnqueueResult]:
        """Write the items (idempotent by message id). With ``generation``, only while that is
        still the sending host's current one: else ``StoreFenced`` and nothing is written."""
        ...

    async def get_message(self, message_id: str) -> MessageRow | None: ...

    async def fetch_inbound(
        self,
        host_id: str,
        generation: int,
        *,
        limit: int = 500,
        session_ids: Collection[str] | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD_CHARS,
        skip_seqs: Collection[int] = (),
    ) -> list[InboundRow]:
        """The host's queued deliveries in seq order (of ``session_ids`` only, when given),
        leaving out those whose seq is in ``skip_seqs`` (the statement does: they are neither
        sent nor counted against ``limit``). A payload over ``max_payload`` characters is not
        read (``payload_problem`` says so).

        Nothing is marked: the generation fence makes the current relay the only reader that
        gets rows, and a row stays queued until ``ack`` finishes it.
        """
        ...

    async def ack(self, host_id: str, generation: int, acks: Sequence[Ack]) -> int: ...

    async def receipts(
        self, host_id: str, generation: int, *, limit: int = 500
    ) -> list[ReceiptRow]: ...

    async def consume_receipts(
        self, host_id: str, generation: int, receipt_ids: Sequence[int]
    ) -> None: ...

    async def add_receipts(
        self, host_id: str, generation: int, receipts: Sequence[LateReceipt]
    ) -> int:
        """Write receipts as ``host_id`` (the recipient's host) for the senders' hosts, and
        wake them; nothing for a stale generation. Returns how many were written."""
        ...

    async def forget_session(self, host_id: str, generation: int, session_id: str) -> int:
        """``forget``: expire (code ``forgotten``) what is still queued for one of the host's
        sessions, with receipts for the senders, and drop its roster row. Returns how many
        deliveries expired; nothing for a stale generation."""
        ...

    async def reserve(
        self,
        host_id: str,
        generation: int,
        *,
        project: str,
        session_id: str,
        globs: Sequence[str],
        mode: Mode,
        ttl_s: float,
        reason: str | None,
        lapsed: Collection[str] = (),
        quotas: Quotas = DEFAULT_QUOTAS,
    ) -> Reserved | None:
        """Reserve paths of a project for one of the host's sessions, all or none; None for a
        stale generation, ``QuotaExceeded`` past ``quotas`` (docs/agents.md#path-reservations)."""
        ...

    async def release(
        self,
        host_id: str,
        generation: int,
        *,
        project: str,
        session_id: str,
        globs: Sequence[str] | None,
    ) -> int | None: ...

    async def reservations(
        self, project: str | None = None, *, lapsed: Collection[str] = ()
    ) -> list[Held]:
        """The live reservations, those of hosts in ``lapsed`` (the reader's judgement of their
        leases) left out."""
        ...

    async def reservation_page(
        self,
        project: str | None = None,
        *,
        lapsed: Collection[str] = (),
        per_host: int = PER_HOST,
        limit: int = READ_LIMIT,
    ) -> tuple[list[Held], bool]:
        """``reservations``, bounded whatever the store holds (each host's first ``per_host``,
        ``limit`` in all), and whether there were more."""
        ...

    async def sweep_reservations(self, host_id: str, generation: int) -> int: ...

    async def expire(self) -> int: ...

    async def purge(self, *, batch: int = 1000, older_than_s: float | None = None) -> int:
        """Delete rows finished more than ``older_than_s`` ago (default: the retention)."""
        ...

    async def settings(self) -> StoreSettings: ...

    async def stuck_transactions(self, idle_s: float) -> list[StuckTransaction]:
        """Other sessions idle in a transaction for over ``idle_s`` holding locks on the store's
        tables. PostgreSQL only: on SQLite a stuck lock shows as writers timing out."""
        ...

    def waiter(self, host_id: str) -> Waiter:
        """A blocking waiter for ``host_id``'s hints; made and used in a thread other than
        the store's loop's (the relay's watcher)."""
        ...
