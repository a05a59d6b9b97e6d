"""The per-sender rate limit (pure): at most ``count`` new messages per sender in any window
of ``window_s`` seconds. Two agents that keep answering each other run into it and get a clear
refusal (``rate_limited``) instead of flooding each other (docs/agents.md#policy).

A message id is counted once: a retry of the same message, or a row handed over again by the
relay, is not a new message.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

# Past this many senders remembered, those idle for a whole window are forgotten.
_PRUNE_AT: Final = 10_000


class RateLimiter:
    def __init__(
        self, count: int, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.count = count
        self.window_s = window_s
        self._clock = clock
        # sender -> {message id: time} of its messages inside the window, oldest first.
        self._seen: dict[str, OrderedDict[str, float]] = {}

    def admit(self, sender: str, message_id: str) -> bool:
        """Count ``message_id`` for ``sender``; False when that would exceed the limit."""
        now = self._clock()
        recent = self._seen.setdefault(sender, OrderedDict())
        while recent and next(iter(recent.values())) <= now - self.window_s:
            recent.popitem(last=False)
        if message_id in recent:
            return True
        if len(recent) >= self.count:
            return False
        recent[message_id] = now
        if len(self._seen) > _PRUNE_AT:
            self._drop_idle(now)
        return True

    def _drop_idle(self, now: float) -> None:
        """Senders with nothing inside the window hold no memory."""
        for sender in [
            s
            for s, d in self._seen.items()
            if not d or next(reversed(d.values())) <= now - self.window_s
        ]:
            del self._seen[sender]

    @property
    def senders(self) -> int:
        """How many senders are remembered (bounded: idle ones are pruned)."""
        return len(self._seen)

    def why(self) -> str:
        return (
            f"this sender sent more than {self.count} messages in {self.window_s:g} s (the "
            "per-sender rate limit that stops message loops between agents); nothing was sent, "
            "send again later"
        )
