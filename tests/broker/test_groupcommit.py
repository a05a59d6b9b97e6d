"""Group commit for the dedup authority (docs/perf-log/2026-12.md, "Same-host path reshaped"):
the sends of one loop turn share one transaction and get the decisions one write after another
would have given them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from crossintercom.local_broker.authority.dedup import Decision, DecisionKind, DedupAuthority
from crossintercom.local_broker.authority.groupcommit import GroupCommit

OUTCOME = {"id": "m1", "outcome": "delivered", "recipient": "s-1"}


def test_one_turn_is_one_group_and_durable(tmp_path: Path) -> None:
    async def main() -> list[Decision]:
        with DedupAuthority(tmp_path) as auth:
            commits = GroupCommit(auth)
            commits.busy = 22  # sends under way: they share a group
            return list(
                await asyncio.gather(
                    *(commits.lodge(f"m{i}", b"p", remote=False) for i in range(20)),
                    commits.lodge("m0", b"p", remote=False),  # the same id again
                    commits.lodge("m1", b"other", remote=True),
                )
            )

    decisions = asyncio.run(main())
    assert [d.kind for d in decisions] == [DecisionKind.NEW] * 20 + [
        DecisionKind.UNCERTAIN,
        DecisionKind.CONFLICT,
    ]
    with DedupAuthority(tmp_path) as again:  # committed before the callers resumed
        assert again.stats()[0] == 20


def test_lodging_an_id_beside_its_acceptance_sees_the_retained_outcome(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[Decision, Decision]:
        with DedupAuthority(tmp_path) as auth:
            commits = GroupCommit(auth)
            first = await commits.lodge("m1", b"p", remote=False)  # alone: written at once
            commits.busy = 2
            accepting = asyncio.ensure_future(commits.accept("m1", OUTCOME))
            retry = await commits.lodge("m1", b"p", remote=False)
            await accepting
            return first, retry

    first, retry = asyncio.run(main())
    assert first.kind is DecisionKind.NEW
    assert retry == Decision(DecisionKind.RETAINED, OUTCOME)


def test_a_lone_send_writes_without_waiting_for_the_loop(tmp_path: Path) -> None:
    async def main() -> Decision:
        with DedupAuthority(tmp_path) as auth:
            commits = GroupCommit(auth)
            commits.busy = 1
            task = asyncio.ensure_future(commits.lodge("m1", b"p", remote=False))
            await asyncio.sleep(0)  # one step of the task: enough when nothing else is under way
            assert task.done()
            return task.result()

    assert asyncio.run(main()).kind is DecisionKind.NEW
