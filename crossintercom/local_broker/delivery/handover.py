"""Hand-over of a message the relay brings from another host for a session on this one:
the sender's rate limit, then either the answer to an open ask of the recipient (from the
session it went to, once: ``Delivery.route_reply``) or delivery through the recipient's inbound
policy (``Delivery.deliver``). Any failure is a receipt, never an exception, so the relay
always learns what became of the row.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Sequence

from crossintercom.errors import Code
from crossintercom.local_broker.delivery import outcomes
from crossintercom.local_broker.delivery.local import Delivery
from crossintercom.local_broker.delivery.ratelimit import RateLimiter
from crossintercom.local_broker.sessions.registry import Registry
from crossintercom.local_broker.state.store import BrokerState
from crossintercom.models import REFUSAL_ADVICE, Message, Outcome, Receipt

log = logging.getLogger(__name__)


class Handover:
    def __init__(
        self, registry: Registry, state: BrokerState, delivery: Delivery, limiter: RateLimiter
    ) -> None:
        self.registry = registry
        self.state = state
        self.delivery = delivery
        # Sending's limiter: a sender on another host is held to the same limit as local ones.
        self.limiter = limiter

    async def receive_many(self, msgs: Sequence[Message], recipient: str) -> list[Receipt]:
        """``receive`` for each of one recipient's messages, in their order: each hand-over
        writes its ``deliver`` frame before its first wait and they start in order, so the
        recipient gets them in order, in one write, and saves them in one inbox transaction
        (docs/perf-log/2026-12.md, "Cross-host throughput and catch-up")."""
        handing = asyncio.gather(*(self.receive(m, recipient) for m in msgs))
        owner = self.registry.owner(recipient)
        if owner is not None and len(msgs) > 1:
            # Held past the tasks' first steps: one write for the batch, not the first frame
            # alone and then the rest (docs/perf-log/2026-12.md, "Cross-host throughput: the
            # cycle").
            owner.out.hold_turn()
        return list(await handing)

    async def receive(self, msg: Message, recipient: str) -> Receipt:
        try:
            if not self.limiter.admit(f"{msg.sender.host}/{msg.sender.id}", msg.id):
                # A sender on another host over the rate: refused here too, whatever its
                # own host allowed (docs/agents.md#policy).
                receipt = Receipt(
                    msg.id, Outcome.REFUSED, recipient, Code.RATE_LIMITED, self.limiter.why()
                )
            elif msg.reply_to is not None and self.state.ask_owner(msg.reply_to) == recipient:
                if self.state.may_answer(msg.reply_to, msg.sender.id):
                    receipt = await self.delivery.route_reply(msg, recipient)
                else:
                    log.warning(
                        "reply %s from %s@%s refused: ask %s did not go to that session",
                        msg.id,
                        msg.sender.id,
                        msg.sender.host,
                        msg.reply_to,
                    )
                    receipt = Receipt(
                        msg.id,
                        Outcome.REFUSED,
                        recipient,
                        Code.REPLY_NOT_AUTHORISED,
                        REFUSAL_ADVICE[Code.REPLY_NOT_AUTHORISED],
                    )
            elif self.registry.is_local(recipient):
                receipt = await self.delivery.deliver(msg, recipient, asker_host=msg.sender.host)
            else:
                receipt = Receipt(
                    msg.id,
                    Outcome.REFUSED,
                    recipient,
                    Code.NOT_FOUND,
                    "no such session on this host",
                )
        except sqlite3.Error as exc:
            # The relay keeps the row queued and hands it over again later.
            log.error("inbound hand-over failed", extra={"id": msg.id, "error": str(exc)})
            receipt = outcomes.storage_failed(msg.id, recipient, exc)
        except Exception as exc:
            log.exception("inbound hand-over failed", extra={"id": msg.id})
            receipt = Receipt(msg.id, Outcome.UNKNOWN, recipient, Code.INTERNAL, str(exc))
        return receipt
