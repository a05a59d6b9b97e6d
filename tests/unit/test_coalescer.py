"""The broker's and client's write coalescing (``protocol.Coalescer``): a lone frame goes at
once; a batch of frames its tasks write on the next loop turn goes in one write once the turn
is held (docs/perf-log/2026-12.md, "Cross-host throughput: the cycle")."""

from __future__ import annotations

import asyncio
from typing import cast

from crossintercom import protocol as p


class _Writes:
    """Records each write a Coalescer hands its stream (the system calls it would make)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False


async def _batch(hold: bool, already_written: bool) -> list[bytes]:
    sink = _Writes()
    out = p.Coalescer(cast(asyncio.StreamWriter, sink))
    if already_written:
        out.write(b"<earlier>")

    async def one(i: int) -> None:
        out.write(b"%d;" % i)

    batch = asyncio.gather(*(one(i) for i in range(5)))
    if hold:
        out.hold_turn()
    await batch
    for _ in range(3):
        await asyncio.sleep(0)
    return sink.writes


def test_a_held_turn_writes_the_batch_once() -> None:
    assert asyncio.run(_batch(hold=True, already_written=False)) == [b"0;1;2;3;4;"]


def test_a_held_turn_after_a_write_of_this_turn_still_writes_the_batch_once() -> None:
    writes = asyncio.run(_batch(hold=True, already_written=True))
    assert writes == [b"<earlier>", b"0;1;2;3;4;"]


def test_without_holding_the_first_frame_goes_alone() -> None:
    assert asyncio.run(_batch(hold=False, already_written=False)) == [b"0;", b"1;2;3;4;"]
