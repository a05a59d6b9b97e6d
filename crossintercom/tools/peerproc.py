"""The peer's consumer for `crossintercom bench`: a PgQueuer worker in a process of its own.

``python -m crossintercom.tools.peerproc CONNINFO`` runs a PgQueuer ``QueueManager`` (its
public API, run with its defaults) with one entrypoint, ``bench``, whose jobs do nothing but
note the wall-clock time they started (``time.time()``, the clock crossintercom's inbox uses
for ``received_at``). It prints ``ready`` when it starts its worker; each line ``N`` on stdin
asks for the start time of the N-th job it runs, printed as soon as that job has started (at
once if it already has). It stops when stdin closes. A module of its own, like ``rawproc``, so
that it starts without importing the benchmark.
"""

from __future__ import annotations

import asyncio
import sys
import time

ENTRYPOINT = "bench"


class _Starts:
    """Start times of the jobs so far, and the job counts the bench waits for."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.wanted: list[int] = []

    def started(self) -> None:
        self.times.append(time.time())
        self._answer()

    def want(self, n: int) -> None:
        self.wanted.append(n)
        self._answer()

    def _answer(self) -> None:
        while self.wanted and len(self.times) >= self.wanted[0]:
            sys.stdout.write(f"{self.times[self.wanted.pop(0) - 1]:.6f}\n")
            sys.stdout.flush()


async def _consume(conninfo: str) -> None:
    import psycopg
    from pgqueuer import Queries, QueueManager
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.models import Job

    starts = _Starts()
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def job(_job: Job) -> None:
        starts.started()

    loop = asyncio.get_running_loop()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(starts.want, int(line))
        loop.call_soon_threadsafe(qm.shutdown.set)

    worker = asyncio.create_task(qm.run())
    print("ready", flush=True)
    await asyncio.gather(worker, asyncio.to_thread(read_stdin))
    await conn.close()


if __name__ == "__main__":
    asyncio.run(_consume(sys.argv[1]))
