"""The store logic both backends share; they differ in connections, locking and wake-ups."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from crossintercom.errors import (
    SchemaMissing,
    SchemaOutdated,
    SchemaTooNew,
    StoreError,
    StoreInDoubt,
    StoreUnavailable,
)
from crossintercom.models import SessionInfo
from crossintercom.storage import queries as q
from crossintercom.storage.base import (
    Ack,
    EnqueueResult,
    HostRow,
    InboundRow,
    MessageRow,
    OutboundItem,
    ReceiptRow,
    StoreSettings,
    Waiter,
)
from crossintercom.storage.urls import StoreURL

log = logging.getLogger(__name__)
T = TypeVar("T")

EXPIRE_BATCH = 1000


def utcnow() -> datetime:
    return datetime.now(UTC)


def one_line(exc: BaseException) -> str:
    """A driver error as one short line (libpq messages span several)."""
    text = str(getattr(exc, "orig", None) or exc)
    parts = [p.strip() for p in text.splitlines() if p.strip()]
    return "; ".join(parts)[:300] or type(exc).__name__


class SqlMailboxStore:
    """``MailboxStore`` over a SQLAlchemy engine. Subclasses supply the backend's specifics."""

    dialect: str
    skip_locked: bool

    def __init__(self, parsed: StoreURL, engine: Engine) -> None:
        self.parsed = parsed
        self.url_masked = parsed.masked
        self.engine = engine
        # Short, bounded reconnect: a longer outage is the caller's to handle (not_sent).
        self._retry = Retrying(
            retry=retry_if_exception_type(StoreUnavailable),
            stop=stop_after_attempt(3),
            wait=wait_exponential(multiplier=0.1, max=1.0),
            reraise=True,
        )

    # -- plumbing -------------------------------------------------------------------------

    def close(self) -> None:
        self.engine.dispose()

    def _unavailable(self, exc: BaseException) -> StoreError:
        return StoreUnavailable(f"cannot reach the store {self.url_masked}: {one_line(exc)}")

    def _translate(self, exc: SQLAlchemyError) -> StoreError:
        if isinstance(exc, DBAPIError) and (
            exc.connection_invalidated or self._is_connection_error(exc)
        ):
            return self._unavailable(exc)
        return StoreError(f"store {self.url_masked} failed: {one_line(exc)}")

    def _is_connection_error(self, exc: DBAPIError) -> bool:
        raise NotImplementedError

    def _commit_failed(self, exc: SQLAlchemyError) -> StoreError:
        """What a failed COMMIT means; on a network database the outcome is unknown."""
        return StoreInDoubt(
            f"lost the store {self.url_masked} during COMMIT ({one_line(exc)}); "
            "the write may or may not have landed: read it back by id"
        )

    def _run_once(self, fn: Callable[[Connection], T], after: Callable[[], None] | None) -> T:
        try:
            conn = self.engine.connect()
        except SQLAlchemyError as exc:
            raise self._unavailable(exc) from exc
        with conn:
            try:
                trans = conn.begin()
                result = fn(conn)
            except SQLAlchemyError as exc:
                raise self._translate(exc) from exc
            try:
                trans.commit()
            except SQLAlchemyError as exc:
                raise self._commit_failed(exc) from exc
        if after is not None:
            after()
        return result

    def _run(
        self,
        fn: Callable[[Connection], T],
        *,
        after: Callable[[], None] | None = None,
        retry: bool = True,
    ) -> T:
        """Run ``fn`` in one transaction; reconnect (bounded) only before anything committed."""
        if not retry:
            return self._run_once(fn, after)
        result: T = self._retry(self._run_once, fn, after)
        return result

    # Backend hooks: how wake-ups are sent.
    def _notify_in_txn(self, conn: Connection, host_ids: Collection[str]) -> None:
        """Queue wake-ups that are sent on commit (Postgres NOTIFY)."""

    def _after_commit(self, host_ids: Collection[str]) -> None:
        """Send wake-ups that need the commit to have happened (SQLite doorbells)."""

    # -- schema ---------------------------------------------------------------------------

    def check_schema(self) -> None:
        from crossintercom.storage import migrate

        def read(conn: Connection) -> str | None:
            if not inspect(conn).has_table("alembic_version"):
                return None
            return conn.execute(q.SCHEMA_VERSION).scalar()

        version = self._run(read, retry=False)
        if version is None:
            raise SchemaMissing(
                f"the store {self.url_masked} has no crossintercom schema; "
                f"run `crossintercom db upgrade --store {self.url_masked}`"
            )
        head = migrate.head_revision()
        if version == head:
            return
        if version not in migrate.known_revisions():
            raise SchemaTooNew(
                f"the store {self.url_masked} has schema revision {version}, newer than this "
                f"crossintercom knows (head {head}); upgrade crossintercom on this host"
            )
        raise SchemaOutdated(
            f"the store {self.url_masked} has schema revision {version}, older than {head}; "
            f"run `crossintercom db upgrade --store {self.url_masked}`"
        )

    # -- hosts ----------------------------------------------------------------------------

    def claim_host(self, host_id: str) -> int:
        return self._run(lambda c: int(c.execute(q.claim_host(self.dialect, host_id)).scalar_one()))

    def heartbeat(self, host_id: str, generation: int) -> bool:
        return self._run(lambda c: c.execute(q.heartbeat(host_id, generation)).rowcount == 1)

    def hosts(self) -> list[HostRow]:
        return self._run(lambda c: [HostRow(*row) for row in c.execute(q.list_hosts())])

    @staticmethod
    def _senders(conn: Connection, message_ids: set[str]) -> dict[str, str]:
        return dict(conn.execute(q.message_senders(message_ids)).all())

    @staticmethod
    def _is_current(conn: Connection, host_id: str, generation: int) -> bool:
        return conn.execute(q.current_generation(host_id)).scalar() == generation

    # -- roster ---------------------------------------------------------------------------

    def publish_sessions(
        self, host_id: str, generation: int, sessions: Sequence[SessionInfo]
    ) -> bool:
        def write(conn: Connection) -> bool:
            if not self._is_current(conn, host_id, generation):
                return False
            conn.execute(q.delete_roster(host_id))
            if sessions:
                conn.execute(
                    q.insert_roster(),
                    [
                        {
                            "host_id": host_id,
                            "session_id": s.id,
                            "name": s.name,
                            "cwd": s.cwd,
                            "model": s.model,
                            "status": s.status,
                            "purpose": s.purpose,
                            "groups": list(s.groups),
                            "durable": s.durable,
                            "online": s.online,
                        }
                        for s in sessions
                    ],
                )
            return True

        return self._run(write)

    def roster(self) -> list[SessionInfo]:
        def read(conn: Connection) -> list[SessionInfo]:
            return [
                SessionInfo(
                    id=r.session_id,
                    host=r.host_id,
                    name=r.name,
                    cwd=r.cwd,
                    model=r.model,
                    status=r.status,
                    purpose=r.purpose,
                    groups=tuple(r.groups),
                    durable=r.durable,
                    online=r.online,
                )
                for r in conn.execute(q.list_roster())
            ]

        return self._run(read)

    # -- messages -------------------------------------------------------------------------

    def enqueue(self, items: Sequence[OutboundItem]) -> list[EnqueueResult]:
        woken: set[str] = set()

        def write(conn: Connection) -> list[EnqueueResult]:
            woken.clear()  # a retried attempt starts over
            limits = self._settings(conn)
            now = utcnow()
            expires = now + timedelta(seconds=limits.retention_s)
            results = []
            for item in items:
                results.append(self._enqueue_one(conn, item, limits, now, expires, woken))
            self._notify_in_txn(conn, woken)
            return results

        return self._run(write, after=lambda: self._after_commit(woken))

    def _enqueue_one(
        self,
        conn: Connection,
        item: OutboundItem,
        limits: StoreSettings,
        now: datetime,
        expires: datetime,
        woken: set[str],
    ) -> EnqueueResult:
        if item.size > limits.max_message_bytes:
            return EnqueueResult(
                item.message_id, item.recipient_session, "refused", False, "too_large"
            )
        conn.execute(
            q.insert_message_if_absent(self.dialect),
            {
                "message_id": item.message_id,
                "sender_host": item.sender_host,
                "digest": item.digest,
                "payload": item.payload,
                "size": item.size,
                "created": now,
            },
        )
        digest = conn.execute(q.message_digest(item.message_id)).scalar_one()
        if digest != item.digest:
            return EnqueueResult(
                item.message_id, item.recipient_session, "refused", False, "payload_conflict"
            )
        new_seq = conn.execute(
            q.insert_delivery_if_absent(self.dialect),
            {
                "message_id": item.message_id,
                "recipient_host": item.recipient_host,
                "recipient_session": item.recipient_session,
                "state": "queued",
                "expires_at": expires,
            },
        ).scalar()
        inserted = new_seq is not None
        state = conn.execute(q.delivery_state(item.message_id, item.recipient_session)).scalar_one()
        if inserted:
            woken.add(item.recipient_host)
        return EnqueueResult(item.message_id, item.recipient_session, state, inserted, None)

    def get_message(self, message_id: str) -> MessageRow | None:
        def read(conn: Connection) -> MessageRow | None:
            digest = conn.execute(q.message_digest(message_id)).scalar()
            if digest is None:
                return None
            states = dict(conn.execute(q.message_states(message_id)).all())
            return MessageRow(message_id, digest, states)

        return self._run(read)

    def claim_inbound(
        self,
        host_id: str,
        generation: int,
        *,
        limit: int = 500,
        session_ids: Collection[str] | None = None,
    ) -> list[InboundRow]:
        if session_ids is not None and not session_ids:
            return []
        stmt = q.inbound(host_id, generation, limit, session_ids, skip_locked=self.skip_locked)
        return self._run(lambda c: [InboundRow(*row) for row in c.execute(stmt)])

    def ack(self, host_id: str, generation: int, acks: Sequence[Ack]) -> int:
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            if not acks or not self._is_current(conn, host_id, generation):
                return 0
            now = utcnow()
            finished = [
                a
                for a in acks
                if conn.execute(
                    q.finish_delivery(
                        host_id, a.message_id, a.recipient_session, a.outcome, a.code, now
                    )
                ).rowcount
                == 1
            ]
            if finished:
                senders = self._senders(conn, {a.message_id for a in finished})
                conn.execute(
                    q.insert_receipt(),
                    [
                        {
                            "sender_host": senders[a.message_id],
                            "message_id": a.message_id,
                            "recipient_session": a.recipient_session,
                            "recipient_host": host_id,
                            "outcome": a.outcome,
                            "code": a.code,
                            "created": now,
                        }
                        for a in finished
                    ],
                )
                woken.update(senders.values())
                self._notify_in_txn(conn, woken)
            return len(finished)

        return self._run(write, after=lambda: self._after_commit(woken))

    def receipts(self, host_id: str, generation: int, *, limit: int = 500) -> list[ReceiptRow]:
        def read(conn: Connection) -> list[ReceiptRow]:
            if not self._is_current(conn, host_id, generation):
                return []
            return [ReceiptRow(*r) for r in conn.execute(q.list_receipts(host_id, limit))]

        return self._run(read)

    def consume_receipts(self, host_id: str, generation: int, receipt_ids: Sequence[int]) -> None:
        def write(conn: Connection) -> None:
            if receipt_ids and self._is_current(conn, host_id, generation):
                conn.execute(q.delete_receipts(host_id, list(receipt_ids)))

        self._run(write)

    def expire(self) -> int:
        total = 0
        while True:
            count = self._expire_batch()
            total += count
            if count < EXPIRE_BATCH:
                return total

    def _expire_batch(self) -> int:
        woken: set[str] = set()

        def write(conn: Connection) -> int:
            woken.clear()
            now = utcnow()
            rows = conn.execute(q.expire_batch(now, EXPIRE_BATCH)).all()
            if not rows:
                return 0
            senders = self._senders(conn, {r[1] for r in rows})
            conn.execute(
                q.insert_receipt(),
                [
                    {
                        "sender_host": senders[message_id],
                        "message_id": message_id,
                        "recipient_session": session,
                        "recipient_host": recipient_host,
                        "outcome": "expired",
                        "code": "expired",
                        "created": now,
                    }
                    for _seq, message_id, session, recipient_host in rows
                ],
            )
            woken.update(senders.values())
            self._notify_in_txn(conn, woken)
            return len(rows)

        return self._run(write, after=lambda: self._after_commit(woken))

    def purge(self, *, batch: int = 1000, older_than_s: float | None = None) -> int:
        """Delete finished deliveries (and then-orphaned messages) in bounded transactions.

        Finished rows are kept for ``older_than_s`` (default: the store's retention) because
        they are the dedup record a sender's retry of the same id is answered from.
        """
        keep = self.settings().retention_s if older_than_s is None else older_than_s
        total = 0
        while True:
            cutoff = utcnow() - timedelta(seconds=keep)

            def one_batch(conn: Connection, cutoff: datetime = cutoff) -> tuple[int, int]:
                ids = conn.execute(q.purge_deliveries(cutoff, batch)).scalars().all()
                if ids:
                    conn.execute(q.purge_orphan_messages(set(ids)))
                return len(ids), conn.execute(q.purge_receipts(cutoff, batch)).rowcount

            done, receipts = self._run(one_batch)
            total += done + receipts
            if done < batch and receipts < batch:
                return total

    # -- settings -------------------------------------------------------------------------

    @staticmethod
    def _settings(conn: Connection) -> StoreSettings:
        row = conn.execute(q.read_settings()).one_or_none()
        return StoreSettings(*row) if row is not None else StoreSettings()

    def settings(self) -> StoreSettings:
        return self._run(self._settings)

    def update_settings(
        self, *, max_message_bytes: int | None = None, retention_s: int | None = None
    ) -> None:
        """Change the store-wide limits (an operator action, not a relay one)."""
        values: dict[str, Any] = {}
        if max_message_bytes is not None:
            values["max_message_bytes"] = max_message_bytes
        if retention_s is not None:
            values["retention_s"] = retention_s
        if values:
            self._run(lambda c: c.execute(q.update_settings(values)))

    def waiter(self, host_id: str) -> Waiter:
        raise NotImplementedError
