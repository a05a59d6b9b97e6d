"""The relay: bridges this host's broker to the shared store (DESIGN §2, §6).

It is a ``control`` client of the local broker and the only component that talks to the
database. Outbound: ``forward`` frames from the broker are batched into one store transaction,
then answered with one receipt per recipient (``delivered`` when the remote host acknowledged
within ``remote_ack_wait``, else ``queued``; ``not_sent`` only when nothing was committed).
Inbound: rows queued for this host are read by state in sequence order, handed to the broker
and acknowledged in the store after the recipient's ack. Every write is fenced by the
generation this relay took at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import threading
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tenacity

from crossintercom.client import AsyncClient, Identity
from crossintercom.config import Settings
from crossintercom.errors import (
    CrossintercomError,
    StoreError,
    StoreInDoubt,
    StoreUnavailable,
)
from crossintercom.models import Message, SessionInfo, new_id
from crossintercom.runtime import ensure_runtime_dir, modes
from crossintercom.storage import (
    Ack,
    EnqueueResult,
    InboundRow,
    InDoubtEnqueue,
    LeaseTracker,
    MailboxStore,
    OutboundItem,
    ReceiptRow,
    mask_url,
    open_store,
)

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
POLL_BACKSTOP_S = 2.0
HOUSEKEEPING_S = 60.0
INBOUND_BATCH = 500
# A row the recipient's broker answered for but could not hand over this many times is marked
# refused ("undeliverable") rather than retried forever.
MAX_HANDOVER_ATTEMPTS = 5
# A receipt from another host for a message we queued earlier is shown to the sender; we keep
# the sender of recent forwards to know whom to tell.
_SENDER_MEMORY = 100_000


class RelayError(CrossintercomError):
    """The relay cannot run."""

    code = "relay_error"


class RelayInUse(RelayError):
    """Another relay is already running for this host on this machine."""

    code = "relay_in_use"


class Fenced(RelayError):
    """A newer relay took over this host id; this one stops."""

    code = "relay_fenced"


@dataclass
class _Forward:
    fid: int
    message: dict[str, Any]
    recipients: list[dict[str, str]]
    waits: dict[str, asyncio.Future[ReceiptRow]] = field(default_factory=dict)


def hold_relay_lock(settings: Settings) -> int:
    """flock relay.lock: one relay per host id per machine; held until the process ends."""
    path = settings.file("relay.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, modes(settings)[1])
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RelayInUse(
            f"a relay is already running for host id {settings.host_id!r} on this machine "
            f"({path} is locked)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class Relay:
    def __init__(self, settings: Settings, store: MailboxStore) -> None:
        self.settings = settings
        self.host = settings.host_id
        self.store = store
        self.generation = 0
        self.client: AsyncClient | None = None
        self.local_sessions: list[SessionInfo] = []
        self.remote_sessions: list[dict[str, Any]] = []
        self.leases = LeaseTracker(settings.lease_s)
        self._outbox: asyncio.Queue[_Forward] = asyncio.Queue()
        self._receipt_waits: dict[tuple[str, str], asyncio.Future[ReceiptRow]] = {}
        self._senders: OrderedDict[str, str] = OrderedDict()
        self._failed_handovers: Counter[tuple[str, str]] = Counter()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._published: list[dict[str, Any]] | None = None
        self._publish_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.failure: BaseException | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.generation = await self._store_call(self.store.claim_host, self.host)
        log.info("relay started", extra={"host_id": self.host, "generation": self.generation})
        ident = Identity(id=new_id(), name="relay", purpose="control", status=self.store.url_masked)
        self.client = AsyncClient(self.settings, ident, mode="own", spawn=True, reconnect=True)
        self.client.on_frame = self._on_frame
        await self.client.connect()
        waiter_thread = threading.Thread(
            target=self._watch_store, name="relay-wakeups", daemon=True
        )
        waiter_thread.start()
        jobs = [
            self._heartbeat_loop(),
            self._outbound_loop(),
            self._inbound_loop(),
            self._housekeeping_loop(),
        ]
        tasks = [asyncio.get_running_loop().create_task(j) for j in jobs]
        stopper = asyncio.get_running_loop().create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception() is not None:
                    self.failure = t.exception()
        finally:
            self._stop.set()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            stopper.cancel()
            await self._say_goodbye()
            await self.client.close()
            waiter_thread.join(POLL_BACKSTOP_S + 1)
        if self.failure is not None:
            raise self.failure

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    async def _say_goodbye(self) -> None:
        """Show our sessions offline at once rather than after the lease lapses."""
        offline = [
            SessionInfo.from_dict(s.to_dict() | {"online": False}) for s in self.local_sessions
        ]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                self._store_call(self.store.publish_sessions, self.host, self.generation, offline),
                3.0,
            )

    async def _store_call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """Run a blocking store call off the event loop."""
        return await asyncio.to_thread(fn, *args, **kw)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- broker frames --------------------------------------------------------------------------

    def _on_frame(self, frame: dict[str, Any]) -> None:
        ftype = frame.get("type")
        if ftype == "forward":
            self._outbox.put_nowait(
                _Forward(int(frame["fid"]), frame["message"], list(frame["recipients"]))
            )
        elif ftype == "local_roster":
            self.local_sessions = [SessionInfo.from_dict(s) for s in frame.get("sessions", [])]
            self._spawn(self._publish_roster())
            # Sent on every (re)registration: the broker may be new, so give it the roster.
            self._post_remote_roster()
            self._wake.set()
        elif ftype == "refresh_roster":
            self._spawn(self._refresh_roster(int(frame["fid"])))

    async def _refresh_roster(self, fid: int) -> None:
        with contextlib.suppress(StoreError):
            await self._import_roster(force=True)
        assert self.client is not None
        self.client.post({"type": "roster_refreshed", "fid": fid})

    # --- roster and liveness ----------------------------------------------------------------------

    async def _publish_roster(self) -> None:
        # One publish at a time, each of the latest roster: concurrent ones (a burst of
        # registrations) collided in the store, and an older snapshot could land last.
        async with self._publish_lock:
            sessions = list(self.local_sessions)
            snapshot = [s.to_dict() for s in sessions]
            if snapshot == self._published:
                return
            try:
                ok = await self._store_call(
                    self.store.publish_sessions, self.host, self.generation, sessions
                )
            except StoreError as exc:
                log.warning("roster publish failed; will retry", extra={"error": exc.message})
                return
            if not ok:
                self._fenced()
                return
            self._published = snapshot

    async def _import_roster(self, *, force: bool = False) -> None:
        hosts = await self._store_call(self.store.hosts)
        self.leases.observe(hosts)
        roster: list[SessionInfo] = await self._store_call(self.store.roster)
        remote = []
        for s in roster:
            if s.host == self.host or s.purpose != "agent":
                continue
            online = s.online and self.leases.alive(s.host)
            remote.append(s.to_dict() | {"online": online})
        if force or remote != self.remote_sessions:
            self.remote_sessions = remote
            self._post_remote_roster()

    def _post_remote_roster(self) -> None:
        if self.client is not None:
            self.client.post({"type": "remote_roster", "sessions": self.remote_sessions})

    def _fenced(self) -> None:
        self.failure = Fenced(
            f"another relay took over host id {self.host!r} (generation {self.generation} is "
            "stale); this relay stops"
        )
        self.stop()

    async def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            try:
                ok = await self._store_call(self.store.heartbeat, self.host, self.generation)
                if not ok:
                    self._fenced()
                    return
                if (
                    self._published is None
                    or [s.to_dict() for s in self.local_sessions] != self._published
                ):
                    await self._publish_roster()
                await self._import_roster()
            except StoreError as exc:
                log.warning("store unreachable; retrying: %s", exc.message)
            await asyncio.sleep(HEARTBEAT_S)

    # --- outbound -------------------------------------------------------------------------------

    async def _outbound_loop(self) -> None:
        while True:
            first = await self._outbox.get()
            batch = [first]
            # Group commit: whatever is already waiting goes in the same transaction, without
            # waiting for more when only one message is there.
            while not self._outbox.empty():
                batch.append(self._outbox.get_nowait())
            await self._forward_batch(batch)

    async def _forward_batch(self, batch: list[_Forward]) -> None:
        items: list[OutboundItem] = []
        for fwd in batch:
            msg = Message.from_dict(fwd.message)
            self._remember_sender(msg.id, msg.sender.id)
            payload = msg.to_dict()
            for r in fwd.recipients:
                key = (msg.id, r["session"])
                fut = self._receipt_waits.get(key)
                if fut is None or fut.done():
                    fut = asyncio.get_running_loop().create_future()
                    self._receipt_waits[key] = fut
                fwd.waits[r["session"]] = fut
                items.append(
                    OutboundItem(
                        message_id=msg.id,
                        sender_host=self.host,
                        recipient_host=r["host"],
                        recipient_session=r["session"],
                        digest=msg.digest(),
                        payload=payload,
                        size=msg.size(),
                    )
                )
        try:
            results: Sequence[EnqueueResult | InDoubtEnqueue] = await self._store_call(
                self.store.enqueue, items
            )
        except StoreInDoubt:
            results = await self._resolve_in_doubt(items)
        except StoreError as exc:
            log.warning("enqueue failed before commit", extra={"error": exc.message})
            for fwd in batch:
                self._answer(
                    fwd,
                    [
                        {
                            "id": fwd.message["id"],
                            "outcome": "not_sent",
                            "recipient": r["session"],
                            "code": "store_unavailable",
                            "message": "the shared store is unreachable; nothing was sent",
                        }
                        for r in fwd.recipients
                    ],
                )
            return
        by_key = {(r.message_id, r.recipient_session): r for r in results}
        for fwd in batch:
            self._spawn(self._settle_forward(fwd, by_key))

    async def _resolve_in_doubt(
        self, items: list[OutboundItem]
    ) -> list[EnqueueResult | InDoubtEnqueue]:
        """The commit's fate is unknown: read the rows by id once the store answers again."""
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_exponential(multiplier=0.2, max=5),
            stop=tenacity.stop_after_delay(self.settings.remote_ack_wait_s + 5),
            retry=tenacity.retry_if_exception_type(StoreError),
            reraise=True,
        )
        out: list[EnqueueResult | InDoubtEnqueue] = []
        try:
            async for attempt in retrying:
                with attempt:
                    out = []
                    for it in items:
                        row = await self._store_call(self.store.get_message, it.message_id)
                        state = None if row is None else row.states.get(it.recipient_session)
                        if state is None:
                            out.append(
                                InDoubtEnqueue(it.message_id, it.recipient_session, "absent")
                            )
                        else:
                            out.append(
                                EnqueueResult(it.message_id, it.recipient_session, state, False)
                            )
        except StoreError:
            return [InDoubtEnqueue(it.message_id, it.recipient_session, "in_doubt") for it in items]
        return out

    async def _settle_forward(
        self, fwd: _Forward, results: dict[tuple[str, str], EnqueueResult | InDoubtEnqueue]
    ) -> None:
        msg_id = fwd.message["id"]
        deadline = time.monotonic() + self.settings.remote_ack_wait_s
        receipts = []
        for r in fwd.recipients:
            sid = r["session"]
            res = results.get((msg_id, sid))
            receipts.append(await self._receipt_for(msg_id, sid, res, fwd.waits[sid], deadline))
            self._receipt_waits.pop((msg_id, sid), None)
        self._answer(fwd, receipts)

    async def _receipt_for(
        self,
        msg_id: str,
        sid: str,
        res: EnqueueResult | InDoubtEnqueue | None,
        wait: asyncio.Future[ReceiptRow],
        deadline: float,
    ) -> dict[str, Any]:
        base = {"id": msg_id, "recipient": sid}
        if res is None or (isinstance(res, InDoubtEnqueue) and res.resolution == "in_doubt"):
            return base | {
                "outcome": "unknown",
                "code": "store_in_doubt",
                "message": "the store connection dropped during commit",
            }
        if isinstance(res, InDoubtEnqueue):  # "absent"
            return base | {
                "outcome": "not_sent",
                "code": "store_unavailable",
                "message": "the commit did not land; nothing was sent",
            }
        if res.code is not None:
            return base | {"outcome": "refused", "code": res.code}
        if res.state == "delivered":
            return base | {"outcome": "delivered"}
        if res.state in ("refused", "expired"):
            return base | {"outcome": "refused", "code": res.state}
        try:
            row = await asyncio.wait_for(
                asyncio.shield(wait), max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            return base | {"outcome": "queued"}
        return base | _receipt_outcome(row)

    def _answer(self, fwd: _Forward, receipts: list[dict[str, Any]]) -> None:
        if self.client is not None:
            self.client.post({"type": "forward_result", "fid": fwd.fid, "receipts": receipts})

    def _remember_sender(self, message_id: str, sender_id: str) -> None:
        self._senders[message_id] = sender_id
        while len(self._senders) > _SENDER_MEMORY:
            self._senders.popitem(last=False)

    # --- inbound and receipts -------------------------------------------------------------------

    def _watch_store(self) -> None:
        """Thread: block on the store's wake-up channel and poke the event loop."""
        loop = self._loop
        assert loop is not None
        while not self._stop.is_set():
            try:
                with self.store.waiter(self.host) as waiter:
                    while not self._stop.is_set():
                        waiter.wait(POLL_BACKSTOP_S)
                        loop.call_soon_threadsafe(self._wake.set)
            except Exception as exc:
                log.warning("wake-up channel failed; reconnecting", extra={"error": str(exc)})
                loop.call_soon_threadsafe(self._wake.set)
                time.sleep(1.0)

    async def _inbound_loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_BACKSTOP_S)
            self._wake.clear()
            try:
                # Receipts for our senders and rows for our sessions are independent reads.
                await asyncio.gather(self._take_receipts(), self._claim_all())
            except StoreError as exc:
                log.warning("store unreachable; retrying", extra={"error": exc.message})
                await asyncio.sleep(1.0)

    async def _claim_all(self) -> None:
        while await self._claim_once():
            pass

    async def _claim_once(self) -> bool:
        """Hand one batch of inbound rows to the broker; True if a full batch was moved."""
        local_ids = [s.id for s in self.local_sessions]
        if not local_ids or self.client is None or not self.client.connected.is_set():
            return False
        rows: list[InboundRow] = await self._store_call(
            self.store.fetch_inbound,
            self.host,
            self.generation,
            limit=INBOUND_BATCH,
            session_ids=local_ids,
        )
        if not rows:
            return False
        per_recipient: dict[str, list[InboundRow]] = defaultdict(list)
        for row in rows:
            per_recipient[row.recipient_session].append(row)
        parts = await asyncio.gather(*(self._hand_over(rs) for rs in per_recipient.values()))
        acks = [a for part in parts for a in part]
        if acks:
            await self._store_call(self.store.ack, self.host, self.generation, acks)
        return len(rows) == INBOUND_BATCH and len(acks) == len(rows)

    async def _hand_over(self, rows: list[InboundRow]) -> list[Ack]:
        """One recipient's rows, all in flight at once; acks for those that landed.

        The frames are written in row order and the broker pushes them to the recipient in the
        order it reads them, so pipelining keeps per-recipient order. A row that did not land
        (unknown, broker gone) stays queued and is handed over again next round; the
        recipient's inbox keys by message id, so that never shows it twice.
        """
        assert self.client is not None
        client = self.client
        answers = await asyncio.gather(
            *(
                client.query(
                    {"type": "inbound", "message": row.payload, "recipient": row.recipient_session}
                )
                for row in rows
            ),
            return_exceptions=True,
        )
        acks = []
        for row, resp in zip(rows, answers, strict=True):
            if isinstance(resp, BaseException):
                log.warning("hand-over failed", extra={"id": row.message_id, "error": str(resp)})
                continue
            outcome = resp.get("outcome")
            code = str(resp.get("code") or "refused")
            key = (row.message_id, row.recipient_session)
            if outcome not in ("delivered", "queued", "refused"):
                # The broker answered but could not hand it over (the recipient never
                # acknowledged): retried next round, but not forever.
                self._failed_handovers[key] += 1
                if self._failed_handovers[key] < MAX_HANDOVER_ATTEMPTS:
                    continue
                outcome, code = "refused", "undeliverable"
            self._failed_handovers.pop(key, None)
            if outcome == "delivered":
                acks.append(Ack(row.message_id, row.recipient_session, "delivered"))
            elif outcome == "queued":
                # Now in the recipient host's durable custody: done for the store.
                acks.append(Ack(row.message_id, row.recipient_session, "delivered", "queued"))
            else:
                acks.append(Ack(row.message_id, row.recipient_session, "refused", code))
        return acks

    async def _take_receipts(self) -> None:
        rows: list[ReceiptRow] = await self._store_call(
            self.store.receipts, self.host, self.generation, limit=INBOUND_BATCH
        )
        if not rows:
            return
        late = []
        for row in rows:
            fut = self._receipt_waits.get((row.message_id, row.recipient_session))
            if fut is not None and not fut.done():
                fut.set_result(row)
                continue
            sender = self._senders.get(row.message_id)
            if sender is not None:
                late.append(
                    {
                        "sender": sender,
                        "id": row.message_id,
                        "recipient": row.recipient_session,
                        "host": row.recipient_host,
                    }
                    | _receipt_outcome(row)
                )
        if late and self.client is not None:
            self.client.post({"type": "remote_receipt", "receipts": late})
        await self._store_call(
            self.store.consume_receipts, self.host, self.generation, [r.id for r in rows]
        )

    async def _housekeeping_loop(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(HOUSEKEEPING_S)
            try:
                await self._store_call(self.store.expire)
                await self._store_call(self.store.purge)
            except StoreError as exc:
                log.warning("housekeeping failed", extra={"error": exc.message})


def _receipt_outcome(row: ReceiptRow) -> dict[str, Any]:
    if row.outcome == "delivered":
        return (
            {"outcome": "queued", "code": "queued_at_host"}
            if row.code == "queued"
            else {"outcome": "delivered"}
        )
    if row.outcome == "expired":
        return {
            "outcome": "expired",
            "code": "expired",
            "message": "not collected within the retention",
        }
    return {"outcome": "refused", "code": row.code or "refused"}


def run_relay(settings: Settings, *, polling_observer: bool = False) -> None:
    """`crossintercom relay`: run until SIGTERM/SIGINT; raises a clear error when it cannot."""
    if not settings.store_url:
        raise RelayError("no store configured: pass --store URL or set CROSSINTERCOM_STORE")
    ensure_runtime_dir(settings)
    lock_fd = hold_relay_lock(settings)
    try:
        store = _open_store_patiently(settings.store_url, polling_observer)
        try:
            asyncio.run(_serve(settings, store))
        finally:
            store.close()
    finally:
        os.close(lock_fd)


def _open_store_patiently(url: str, polling_observer: bool) -> MailboxStore:
    """An unreachable store is retried (the database may be starting); a wrong one is not."""
    retrying = tenacity.Retrying(
        wait=tenacity.wait_chain(
            *[tenacity.wait_fixed(w) for w in (1, 2, 5, 10)], tenacity.wait_fixed(30)
        ),
        retry=tenacity.retry_if_exception_type(StoreUnavailable),
        before_sleep=lambda rs: log.warning(
            "store %s unreachable (attempt %d); retrying", mask_url(url), rs.attempt_number
        ),
        reraise=True,
    )
    store: MailboxStore = retrying(open_store, url, polling_observer=polling_observer)
    return store


async def _serve(settings: Settings, store: MailboxStore) -> None:
    relay = Relay(settings, store)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, relay.stop)
    await relay.run()
