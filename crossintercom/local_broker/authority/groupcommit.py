"""Group commit for the dedup authority (docs/perf-log/2026-12.md, "Same-host path reshaped").

Every lodging and acceptance asked for while the event loop turns is written in one
transaction when it turns next, and each caller resumes once that transaction committed: durable
before ``lodge`` answers ``new``, durable before the sender hears an accepted outcome, exactly
as one write per call was, with one commit for all the sends that reached the same step at once.
A send with no other under way writes at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from crossintercom.local_broker.authority.dedup import (
    AuthorityUnavailable,
    Decision,
    DedupAuthority,
)


class GroupCommit:
    def __init__(self, authority: DedupAuthority) -> None:
        self.authority = authority
        self._lodges: list[tuple[str, bytes, bool, asyncio.Future[Decision]]] = []
        self._accepts: list[tuple[str, str, asyncio.Future[None]]] = []
        self._due = False
        # Operations under way (counted by the broker from the frame's arrival): one alone
        # has nobody to share a group with, so it writes at once instead of a loop turn later.
        self.busy = 0

    def _alone(self) -> bool:
        return self.busy <= 1 and not self._due

    async def lodge(self, op_id: str, payload: bytes, *, remote: bool) -> Decision:
        """``DedupAuthority.lodge``, in the next group; raises ``AuthorityUnavailable``."""
        self.authority.check_op_id(op_id)  # a bad call raises here, alone
        if self._alone():
            [decision], _ = self.authority.commit([(op_id, payload, remote)], [])
            if isinstance(decision, AuthorityUnavailable):
                raise decision
            return decision
        fut: asyncio.Future[Decision] = self._soon()
        self._lodges.append((op_id, payload, remote, fut))
        return await fut

    async def accept(self, op_id: str, outcome: dict[str, Any]) -> None:
        """``DedupAuthority.accept``, in the next group."""
        text = self.authority.encode_outcome(op_id, outcome)  # a bad call raises here, alone
        if self._alone():
            _, error = self.authority.commit([], [(op_id, text)])
            if error is not None:
                raise error
            return
        fut: asyncio.Future[None] = self._soon()
        self._accepts.append((op_id, text, fut))
        await fut

    def _soon(self) -> asyncio.Future[Any]:
        self._schedule()
        return asyncio.get_running_loop().create_future()

    def _schedule(self) -> None:
        if not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._due = False
        accepts, self._accepts = self._accepts, []
        # Lodging an id accepted in this very group waits for the next one, so it
        # sees the retained outcome, as it would have one write after the other.
        accepted = {op_id for op_id, _, _ in accepts}
        lodges = [r for r in self._lodges if r[0] not in accepted]
        self._lodges = [r for r in self._lodges if r[0] in accepted]
        if self._lodges:
            self._schedule()
        try:
            decisions, error = self.authority.commit(
                [(op_id, payload, remote) for op_id, payload, remote, _ in lodges],
                [(op_id, text) for op_id, text, _ in accepts],
            )
        except (AuthorityUnavailable, ValueError) as exc:  # nothing was written
            for fut in [r[3] for r in lodges] + [a[2] for a in accepts]:
                _fail(fut, exc)
            return
        for (*_, rfut), decision in zip(lodges, decisions, strict=True):
            if isinstance(decision, AuthorityUnavailable):
                _fail(rfut, decision)
            elif not rfut.done():
                rfut.set_result(decision)
        for *_, afut in accepts:
            if error is not None:
                _fail(afut, error)
            elif not afut.done():
                afut.set_result(None)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
