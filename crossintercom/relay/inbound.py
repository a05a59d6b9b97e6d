"""Inbound: rows queued for this host are read by state in sequence order, handed to the
broker, and acknowledged in the store after the recipient's ack; receipts for this host's
senders are passed on (``relay.receipts``). Each wake-up names what to look at, so only that
query runs (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Collection
from typing import Final

from crossintercom import protocol as p
from crossintercom.errors import Code, StoreError
from crossintercom.models import Outcome, Receipt
from crossintercom.relay import screening
from crossintercom.relay.core import RelayCore
from crossintercom.relay.outbound import Outbound
from crossintercom.relay.receipts import Receipts
from crossintercom.storage import Ack, Beat, InboundRow, Waiter, Wake
from crossintercom.storage.interface import CATCH_UP
from crossintercom.testhooks import stop_at

log = logging.getLogger(__name__)

POLL_BACKSTOP_S: Final = 2.0
INBOUND_BATCH: Final = 500
# A row the recipient's broker answered for but could not hand over this many times is marked
# refused ("undeliverable") rather than retried forever.
MAX_HANDOVER_ATTEMPTS: Final = 5
STORE_LIMIT_TTL_S: Final = 30.0


class _Stale(Exception):
    """A row read too long ago to be handed over (see ``Inbound._hand_over_batch``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Read:
    """One batch as read, and when the read started (its rows are fresh from then on)."""

    read_at: float
    rows: list[InboundRow]


class Inbound:
    def __init__(self, relay: RelayCore, outbound: Outbound) -> None:
        self.relay = relay
        self.outbound = outbound
        self.receipts = Receipts(relay, outbound)
        self.wake = asyncio.Event()
        self._pending = Wake()
        self._fetched_at = -POLL_BACKSTOP_S
        self._failed_handovers: Counter[tuple[str, str]] = Counter()
        # The batch ack under way (``_hand_over_batch``) and the seqs of the rows it finishes.
        self._acking: asyncio.Future[int] | None = None
        self._acking_seqs: frozenset[int] = frozenset()
        # After a takeover from another machine: rows up to this seq were queued when it froze
        # and may have reached its sessions already; they are handed over flagged
        # ``possible_repeat`` (docs/protocol.md). 0: none.
        self.repeat_through = 0
        # The store-wide message size limit, re-read now and then (an operator may change it).
        self._store_limit = relay.settings.max_message_bytes
        self._store_limit_read = -STORE_LIMIT_TTL_S
        # Set once the wake-up channel was first set up (the relay is ready after it), and what
        # the metrics read of it (``listener_up``, ``listener_reconnects``).
        self.listening = asyncio.Event()
        self._waiter: Waiter | None = None
        self._listener_setups = 0
        self._listener_reconnects = 0

    async def _refresh_store_limit(self) -> None:
        now = time.monotonic()
        if now - self._store_limit_read < STORE_LIMIT_TTL_S:
            return
        limits = await self.relay.store.settings()
        self._store_limit, self._store_limit_read = limits.max_message_bytes, now

    def poke(self, wake: Wake) -> None:
        """Look at what ``wake`` names, on the loop's next turn; receipts the hint carries are
        passed on now, not after a fetch or an ack the loop may be in (the sender waits on
        them: docs/perf-log/2026-12.md, "Cross-host throughput: the cycle")."""
        if wake.hinted:
            self.receipts.take(wake.hinted)
            wake = dataclasses.replace(wake, hinted=())
        self._pending |= wake
        self.wake.set()

    def backstop(self, beat: Beat) -> None:
        """The heartbeat's probe found rows waiting: look at them if no hint did lately (a lost
        hint, a row left queued by a failed hand-over, a writer that sent none)."""
        now = time.monotonic()
        deliveries = beat.deliveries_waiting and now - self._fetched_at >= POLL_BACKSTOP_S
        receipts = beat.receipts_waiting and now - self.receipts.seen_at >= POLL_BACKSTOP_S
        if deliveries or receipts:
            self.poke(Wake(deliveries=deliveries, receipts=receipts))

    def watch_store(self, loop: asyncio.AbstractEventLoop) -> None:
        """Thread: block on the store's wake-up channel and poke the event loop."""
        relay = self.relay
        while not relay.stopping.is_set():
            try:
                with relay.store.waiter(relay.host) as waiter:
                    self._listener_setups += 1
                    if self._listener_setups > 1:
                        self._listener_reconnects += 1
                    self._waiter = waiter
                    loop.call_soon_threadsafe(self.listening.set)
                    try:
                        while not relay.stopping.is_set():
                            wake = waiter.wake(POLL_BACKSTOP_S)
                            if wake is not None:
                                loop.call_soon_threadsafe(self.poke, wake)
                    finally:
                        self._waiter = None
                        self._listener_reconnects += getattr(waiter, "reconnects", 0)
            except Exception as exc:
                log.warning("wake-up channel failed; reconnecting", extra={"error": str(exc)})
                loop.call_soon_threadsafe(self.poke, CATCH_UP)
                time.sleep(1.0)

    def listener_up(self) -> bool:
        """Whether the wake-up channel is set up now (PostgreSQL: LISTEN on the store's
        connection)."""
        waiter = self._waiter
        return waiter is not None and bool(getattr(waiter, "connected", True))

    def listener_reconnects(self) -> int:
        """Times the wake-up channel was set up again after it was lost."""
        waiter = self._waiter
        return self._listener_reconnects + (getattr(waiter, "reconnects", 0) if waiter else 0)

    async def loop(self) -> None:
        while not self.relay.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), POLL_BACKSTOP_S)
            self.wake.clear()
            wake, self._pending = self._pending, Wake()
            if wake.hinted:
                self.receipts.take(wake.hinted)
            if wake.roster:
                self.relay.roster_hinted.set()
            jobs = []
            if wake.receipts:
                jobs.append(self.receipts.read())
            if wake.deliveries:
                jobs.append(self._fetch_all())
            try:
                # Receipts for our senders and rows for our sessions are independent reads.
                await asyncio.gather(*jobs)
            except StoreError as exc:
                log.warning("store unreachable; retrying", extra={"error": exc.message})
                await asyncio.sleep(1.0)
                self.poke(Wake(wake.deliveries, wake.receipts))

    async def _fetch_all(self) -> None:
        """Hand over every queued row, a batch at a time, reading the next batch while one is
        handed over (the read ahead; docs/perf-log/2026-12.md, "Catch-up: the read ahead and the
        stored text passed through").

        The read ahead's statement leaves out the rows being handed over and those of the ack
        under way, so it reads only rows never handed over. It is used only when the batch
        before it was full and every row of it was acknowledged: a row left queued (a failed
        or stale hand-over) is read again, in seq order, by a read that does not skip it, and
        no later row of its recipient overtakes it. The last batch's ack is waited for before
        the loop looks for more wake-ups: going back to them while it ran made smaller
        batches and measured worse ("Cross-host throughput: the cycle")."""
        ahead: asyncio.Future[_Read | None] | None = None
        try:
            if self._acking is not None and self._acking.done():
                await self._acked()  # settled: the read need not skip its rows (failure raises)
            read = await self._read(self._acking_seqs if self._acking is not None else ())
            while read is not None and read.rows:
                full = len(read.rows) == INBOUND_BATCH
                if full:
                    skip = {r.seq for r in read.rows}
                    if self._acking is not None:
                        skip |= self._acking_seqs
                    ahead = asyncio.ensure_future(self._read(skip))
                if not await self._hand_over_batch(read) or ahead is None:
                    break
                read, ahead = await ahead, None
        finally:
            if ahead is not None:
                # Not used: its rows stay queued for the next read. Let finish, not cancelled
                # inside the driver; a failure of it is reported by the next read's.
                with contextlib.suppress(StoreError):
                    await ahead
            await self._acked()

    async def _acked(self) -> None:
        """Wait for the ack under way, if any (its failure raises here: the rows it named stay
        queued and are handed over again; the inbox holds each once)."""
        task, self._acking = self._acking, None
        if task is not None:
            await task

    async def _read(self, skip: Collection[int]) -> _Read | None:
        """One batch of this host's queued rows, leaving out the seqs in ``skip``; None when
        there is nobody to hand rows to."""
        relay = self.relay
        local_ids = [s.id for s in relay.local_sessions]
        if not local_ids or relay.client is None or not relay.client.connected.is_set():
            return None
        await self._refresh_store_limit()
        read_at = self._fetched_at = time.monotonic()
        rows = await relay.store.fetch_inbound(
            relay.host,
            relay.generation,
            limit=INBOUND_BATCH,
            session_ids=local_ids,
            max_payload=relay.settings.max_frame_bytes,
            skip_seqs=skip,
        )
        return _Read(read_at, rows)

    async def _hand_over_batch(self, read: _Read) -> bool:
        """Hand one batch of inbound rows to the broker, then start its ack; True if every row
        of it is acknowledged (so nothing of it is left queued)."""
        relay = self.relay
        rows = read.rows
        stop_at("relay_after_fetch")
        # A batch is handed over only while it is fresh: rows read longer ago than a third of
        # the lease may since belong to a newer relay (this one was frozen, SIGSTOP or a paused
        # VM, and another took over). Left alone they stay queued; the next read is fenced.
        fresh_until = read.read_at + relay.settings.lease_s / 3
        per_recipient: dict[str, list[InboundRow]] = defaultdict(list)
        for row in rows:
            per_recipient[row.recipient_session].append(row)
        parts = await asyncio.gather(
            *(self._hand_over(rs, fresh_until) for rs in per_recipient.values())
        )
        acks = [a for part in parts for a in part]
        # One ack at a time, each after its batch was handed over; the next batch is read and
        # handed over while it runs (docs/perf-log/2026-12.md, "Cross-host throughput and
        # catch-up").
        await self._acked()
        stop_at("relay_before_ack")
        if acks:
            keys = {(a.message_id, a.recipient_session) for a in acks}
            self._acking_seqs = frozenset(
                r.seq for r in rows if (r.message_id, r.recipient_session) in keys
            )
            self._acking = asyncio.ensure_future(
                relay.store.ack(relay.host, relay.generation, acks)
            )
        return len(acks) == len(rows)

    async def _hand_over(self, rows: list[InboundRow], fresh_until: float) -> list[Ack]:
        """One recipient's rows in one ``inbound_batch`` frame (more only past the frame size);
        acks for those that landed.

        The broker pushes them to the recipient in the frame's order, so per-recipient order
        holds. A row that did not land (unknown, broker gone) stays queued and is handed over
        again next round; the recipient's inbox keys by message id, so that never shows it
        twice.
        """
        acks: list[Ack] = []
        screened_out: list[str] = []
        sendable: list[tuple[InboundRow, screening.Cleared]] = []
        relay = self.relay
        claimed = screening.claims(relay.host, relay.local_sessions, relay.remote_sessions)
        for row in rows:
            checked = screening.screen(
                row,
                host=relay.host,
                max_message_bytes=self._store_limit,
                max_frame_bytes=relay.settings.max_frame_bytes,
                claimed=claimed,
            )
            if isinstance(checked, screening.Cleared):
                sendable.append((row, checked))
                continue
            # Refused once (the ack finishes the row), so it neither loops nor blocks the rows
            # behind it.
            log.warning(
                "inbound row %s from %s refused (%s): %s",
                row.message_id,
                row.sender_host,
                checked.code,
                checked.reason,
                extra={"id": row.message_id, "code": checked.code, "error": checked.reason},
            )
            acks.append(
                Ack(
                    row.message_id,
                    row.recipient_session,
                    Outcome.REFUSED.value,
                    checked.code,
                    row.seq,
                )
            )
            screened_out.append(checked.code)
        # The broker answers within its ack timeout; past that (a stuck broker) the rows stay
        # queued and are handed over again next round instead of hanging this host's inbound.
        answer_wait = self.relay.settings.ack_timeout_s * 2 + 5.0
        answers: list[Receipt | BaseException] = []
        for chunk in _chunks(sendable, relay.settings.max_frame_bytes - screening.FRAME_OVERHEAD):
            if answers and isinstance(answers[-1], BaseException):
                # The chunk before did not land: the rows behind it wait too, keeping order.
                answers += [answers[-1]] * len(chunk)
                continue
            answers += await self._hand_over_chunk(chunk, fresh_until, answer_wait)
        stale = sum(isinstance(resp, _Stale) for resp in answers)
        if stale:
            log.warning(
                "%d inbound rows not handed over: read too long ago (was this relay frozen?); "
                "they stay queued",
                stale,
            )
        for (row, _), resp in zip(sendable, answers, strict=True):
            if isinstance(resp, _Stale):
                continue
            if isinstance(resp, BaseException):
                why = {"id": row.message_id, "error": repr(resp)}
                log.warning("hand-over failed; the row stays queued", extra=why)
                continue
            outcome, code = resp.outcome, resp.code or Code.REFUSED
            key = (row.message_id, row.recipient_session)
            if outcome is Outcome.NOT_SENT:
                # Nothing was stored on this host (e.g. its disk is full): the row stays queued
                # in the store until it can be, however long that takes.
                why = {"id": row.message_id, "code": code, "error": resp.message or ""}
                log.warning("hand-over not possible yet; the row stays queued", extra=why)
                continue
            if outcome not in (Outcome.DELIVERED, Outcome.QUEUED, Outcome.REFUSED):
                # The broker answered but could not hand it over (the recipient never
                # acknowledged): retried next round, but not forever.
                self._failed_handovers[key] += 1
                if self._failed_handovers[key] < MAX_HANDOVER_ATTEMPTS:
                    continue
                outcome, code = Outcome.REFUSED, Code.UNDELIVERABLE
            self._failed_handovers.pop(key, None)
            if outcome is Outcome.DELIVERED:
                acks.append(
                    Ack(row.message_id, row.recipient_session, Outcome.DELIVERED.value, seq=row.seq)
                )
            elif outcome is Outcome.QUEUED:
                # Now in the recipient host's durable custody: done for the store.
                acks.append(
                    Ack(
                        row.message_id,
                        row.recipient_session,
                        Outcome.DELIVERED.value,
                        Code.HOST_QUEUED,
                        row.seq,
                    )
                )
            else:
                acks.append(
                    Ack(row.message_id, row.recipient_session, Outcome.REFUSED.value, code, row.seq)
                )
        relay.metrics.handed_in(acks, screened_out)
        return acks

    async def _hand_over_chunk(
        self,
        chunk: list[tuple[InboundRow, screening.Cleared]],
        fresh_until: float,
        answer_wait: float,
    ) -> list[Receipt | BaseException]:
        """One ``inbound_batch`` frame for one recipient's rows; a receipt per row, or why
        none came for any of them (then they all stay queued)."""
        client = self.relay.client
        assert client is not None
        # Checked in the same step as the frame is written (request does not yield before
        # writing while connected), so a freeze cannot fall between check and hand-over.
        if time.monotonic() > fresh_until:
            return [_Stale()] * len(chunk)
        # The screened texts themselves: no message is encoded again (screening.Cleared).
        repeats = [row.message_id for row, _ in chunk if row.seq <= self.repeat_through]
        frame = p.InboundBatchText(
            0, chunk[0][0].recipient_session, [c.wire for _, c in chunk], repeats
        )
        try:
            resp = await asyncio.wait_for(client.request(frame), answer_wait)
        except Exception as exc:
            return [exc] * len(chunk)
        if not isinstance(resp, p.InboundResult) or len(resp.receipts) != len(chunk):
            return [RuntimeError(f"unexpected answer {resp!r}")] * len(chunk)
        return list(resp.receipts)


def _chunks(
    sendable: list[tuple[InboundRow, screening.Cleared]], budget: int
) -> list[list[tuple[InboundRow, screening.Cleared]]]:
    """Consecutive runs of rows whose frame fits ``budget`` bytes, each message's JSON measured
    exactly (one message alone always fits: screening refused any that would not)."""
    out: list[list[tuple[InboundRow, screening.Cleared]]] = []
    size = budget
    for item in sendable:
        length = len(item[1].wire) + 1  # and its comma
        if size + length > budget:
            out.append([])
            size = 0
        out[-1].append(item)
        size += length
    return out
