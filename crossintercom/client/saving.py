"""What a client does with what its broker hands over: each delivery and receipt saved to the
session's durable inbox *before* it is acknowledged, in groups, and what a failed save leads to
(docs/delivery.md, "Saved before delivered"). A part of ``AsyncClient``, which supplies the
connection and its state."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from dataclasses import dataclass
from typing import Literal

from crossintercom import protocol as p
from crossintercom.client.connection import BrokerConnection
from crossintercom.client.identity import Identity
from crossintercom.client.retries import SAVE_RETRY_S
from crossintercom.config import Settings
from crossintercom.errors import Code, InboxUnavailable, RuntimeDirError, UsageError
from crossintercom.inbox import Inbox
from crossintercom.inbox_faults import InboxFaults
from crossintercom.models import Message, Receipt
from crossintercom.runtime import secure_file
from crossintercom.testhooks import crash_at

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Incoming:
    """What a listener sees: a message (saved to the inbox) or a receipt notice."""

    kind: Literal["message", "receipt"]
    message: Message | None = None
    receipt: Receipt | None = None


class SavesDeliveries:
    # AsyncClient's state, as this part uses it.
    settings: Settings
    identity: Identity | None
    reconnect: bool
    incoming: asyncio.Queue[Incoming]
    inbox_faults: InboxFaults
    _conn: BrokerConnection
    _closed: bool
    _inbox: Inbox | None
    _ask_waiters: dict[str, asyncio.Future[Message]]
    _save_retry: asyncio.TimerHandle | None
    _to_save: list[p.Deliver | p.Notice]

    def _drop_connection(self) -> p.FrameWriter | None:
        raise NotImplementedError

    def _on_lost(self) -> None:
        raise NotImplementedError

    @property
    def inbox(self) -> Inbox:
        if self._inbox is None:
            if self.identity is None:
                raise UsageError("this client has no session, so no inbox")
            self._inbox = Inbox.of(self.settings, self.identity.id, self.inbox_faults)
            secure_file(self.settings, self._inbox.path)
        return self._inbox

    def _on_deliver(self, frame: p.Deliver | p.Notice) -> None:
        # Saved in a group: every delivery and notice read before the loop turns shares one
        # inbox transaction, in arrival order, and their acks go out together after its commit.
        self._to_save.append(frame)
        if len(self._to_save) == 1:
            asyncio.get_running_loop().call_soon(self._save_delivered)

    def _save_delivered(self) -> None:
        frames, self._to_save = self._to_save, []
        if self._closed:
            return  # not saved, so not acknowledged: the broker keeps them (docs/delivery.md)
        batch = [self._entry(f) for f in frames]
        try:
            new = self.inbox.save_many([(item, waiter is not None) for item, waiter in batch])
        except (sqlite3.Error, OSError, InboxUnavailable, RuntimeDirError) as exc:
            # RuntimeDirError: what stands where the inbox goes is refused (a planted link).
            for item, _ in batch:
                if isinstance(item, Message):
                    self._save_failed(item, exc)
                else:  # not acknowledged: the broker keeps it queued for the next registration
                    log.error("cannot save a receipt to the inbox: %s", exc)
            return
        crash_at("after_save")  # saved before delivered: the acks follow the commit
        acks: list[p.Ack] = []
        shown: list[Incoming] = []
        for (item, waiter), fresh in zip(batch, new, strict=True):
            if isinstance(item, Receipt):
                acks.append(p.Ack(item.key))
                shown.append(Incoming("receipt", receipt=item))
            elif waiter is None and not fresh and (conflict := self._conflict(item)):
                # The id was reused for another payload after its dedup record was discarded
                # (or that cannot be told now): not saved, so not reported delivered.
                acks.append(p.Ack(item.id, conflict))
            else:
                acks.append(p.Ack(item.id))
                if waiter is not None:
                    waiter.set_result(item)
                elif fresh:  # one handed over again (after a crash or retry) is shown once
                    shown.append(Incoming("message", message=item))
        self._conn.post_many(acks)
        for incoming in shown:
            self.incoming.put_nowait(incoming)

    def _conflict(self, msg: Message) -> str | None:
        """Why a message already held by id cannot be acknowledged as saved, if it cannot."""
        try:
            return Code.ID_CONFLICT if self.inbox.holds_other_payload(msg) else None
        except InboxUnavailable:
            self._hand_over_again()
            return Code.SAVE_FAILED

    def _entry(
        self, frame: p.Deliver | p.Notice
    ) -> tuple[Message | Receipt, asyncio.Future[Message] | None]:
        """What a frame saves, and the ask waiting for it (a reply returned to its waiting ask
        is saved shown: a listener never shows it again)."""
        if isinstance(frame, p.Notice):
            return frame.receipt, None
        msg = frame.message
        waiter = self._ask_waiters.get(msg.reply_to) if msg.reply_to else None
        if waiter is not None and not waiter.done():
            return msg, waiter
        return (msg.with_flags("late") if frame.reply else msg), None

    def _save_failed(self, msg: Message, exc: BaseException) -> None:
        """The inbox cannot be written (full or read-only disk): not saved, so not delivered.
        The broker keeps it queued and hands it over again when this client registers anew,
        which it does after a pause: mail flows once the disk is writable (docs/delivery.md)."""
        log.error("cannot save message %s to the inbox: %s", msg.id, exc.__cause__ or exc)
        self._ack(msg.id, refused=Code.SAVE_FAILED)
        self._hand_over_again()

    def _hand_over_again(self) -> None:
        if self.reconnect and self._save_retry is None:
            self._save_retry = asyncio.get_running_loop().call_later(SAVE_RETRY_S, self._reregister)

    def _reregister(self) -> None:
        self._save_retry = None
        if not self._closed and self._conn.open:
            self._drop_connection()
            self._on_lost()

    def _ack(self, key: str, refused: str | None = None) -> None:
        self._conn.post(p.Ack(key, refused))
