"""The peer a user would pick instead: PgQueuer on the same PostgreSQL server, in the same run.

``Peer`` creates a throwaway database of its own on the store's server (``ci_bench_peer_*``,
dropped at the end), installs PgQueuer's schema there through its public API and runs its
consumer in a process of its own (``peerproc``, PgQueuer's ``QueueManager`` with its defaults).
The bench alternates the peer's phases with crossintercom's (``rounds``):

* ``one_way``: one job at a time, enqueue until the consumer's handler starts (enqueue -> start,
  one wall clock), beside crossintercom's cross-host one-way;
* ``throughput``: as many producers as crossintercom has senders, each enqueueing ``window``
  jobs per call, until the consumer has started them all, beside cross-host throughput;
* ``drain``: a backlog enqueued while no consumer runs, then from starting the consumer until it
  has started them all, beside the backlog catch-up (which also starts its relay).

Each phase also counts the CPU it took (the consumer process, the producing thread and the
backends of the peer's database), beside crossintercom's CPU per delivered message. PgQueuer is
the optional extra ``bench`` (``pip install 'crossintercom[bench]'``); without it the phase is
skipped and the report says how to install it. See docs/performance.md, "The peer".
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import secrets
import time
from typing import Any, Self

from crossintercom.tools.bench.baselines import RawProc
from crossintercom.tools.bench.cpu import CpuAccount
from crossintercom.tools.bench.workload import text

INSTALL = "pip install 'crossintercom[bench]'"
PEER = "PgQueuer"
_DRAIN_BATCH = 500
_WAIT_S = 10.0
# The slowest rate the peer is waited for before the bench gives up (as paths' catch-up).
_SLOWEST_JOBS_PER_S = 50.0


def missing() -> str | None:
    """Why the peer cannot run here (None when it can)."""
    if importlib.util.find_spec("pgqueuer") is None:
        return f"{PEER} is not installed: the peer phase is skipped ({INSTALL} to measure it)"
    return None


class Peer:
    """PgQueuer on the server of ``conninfo``, in a database of its own."""

    def __init__(self, conninfo: str) -> None:
        import psycopg
        from psycopg.conninfo import make_conninfo

        self.dbname = f"ci_bench_peer_{secrets.token_hex(4)}"
        self.admin = psycopg.connect(conninfo, autocommit=True)
        self.conninfo = make_conninfo(conninfo, dbname=self.dbname)
        self.consumer: RawProc | None = None
        self.started = 0  # jobs the running consumer has been given so far
        try:
            self.admin.execute(f"CREATE DATABASE {self.dbname}")
            asyncio.run(self._install())
            self._start_consumer()
        except BaseException:
            self.__exit__()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_consumer()
        with contextlib.suppress(Exception):
            self.admin.execute(f"DROP DATABASE IF EXISTS {self.dbname} WITH (FORCE)")
        self.admin.close()

    @property
    def version(self) -> str:
        from importlib.metadata import version

        return version("pgqueuer")

    async def _install(self) -> None:
        async with self._queries() as queries:
            await queries.install()

    @contextlib.asynccontextmanager
    async def _queries(self) -> Any:
        import psycopg
        from pgqueuer import Queries
        from pgqueuer.db import PsycopgDriver

        conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        try:
            yield Queries(PsycopgDriver(conn))
        finally:
            await conn.close()

    def _start_consumer(self) -> None:
        self.consumer = RawProc("consumer", self.conninfo, module="crossintercom.tools.peerproc")
        self.started = 0

    def _stop_consumer(self) -> None:
        if self.consumer is not None:
            self.consumer.stop()
            self.consumer = None

    def _until(self, n: int) -> float:
        """The start time of the consumer's ``n``-th job from now on, once it has started."""
        assert self.consumer is not None and self.consumer.proc.stdin is not None
        self.started += n
        self.consumer.proc.stdin.write(f"{self.started}\n".encode())
        # A drain of 10,000 takes minutes on a loaded machine: the wait grows with the jobs.
        return self.consumer.arrival(max(_WAIT_S, n / _SLOWEST_JOBS_PER_S))

    def _cpu(self) -> CpuAccount:
        consumer = self.consumer
        assert consumer is not None
        return CpuAccount(lambda: {consumer.proc.pid: "consumer"}, self.conninfo)

    # Each phase runs its own event loop on the thread that calls it (the bench calls it through
    # asyncio.to_thread), so the producers' CPU is that thread's.

    def one_way(self, n: int) -> tuple[list[float], dict[str, float]]:
        """Enqueue -> start of ``n`` jobs one at a time (s), and the CPU per job (ms)."""

        async def run() -> tuple[list[float], dict[str, float]]:
            lat = []
            async with self._queries() as queries:
                cpu = self._cpu()
                cpu.start()
                for i in range(n):
                    t0 = time.time()
                    await queries.enqueue("bench", text(i).encode())
                    lat.append(await asyncio.to_thread(self._until, 1) - t0)
                return lat, cpu.stop(n)

        return asyncio.run(run())

    def throughput(self, total: int, producers: int, window: int) -> tuple[float, dict[str, float]]:
        """Jobs/s from ``producers`` producers until every job has started, and CPU per job."""

        async def run() -> tuple[float, dict[str, float]]:
            per = total // producers
            async with contextlib.AsyncExitStack() as stack:
                queues = [
                    await stack.enter_async_context(self._queries()) for _ in range(producers)
                ]
                cpu = self._cpu()
                done = asyncio.create_task(asyncio.to_thread(self._until, per * producers))
                cpu.start()
                t0 = time.perf_counter()

                async def produce(queries: Any) -> None:
                    for start in range(0, per, window):
                        k = min(window, per - start)
                        await queries.enqueue(
                            ["bench"] * k, [text(start + j).encode() for j in range(k)], [0] * k
                        )

                await asyncio.gather(*(produce(q) for q in queues))
                await done
                rate = per * producers / (time.perf_counter() - t0)
                return rate, cpu.stop(per * producers)

        return asyncio.run(run())

    def drain(self, backlog: int) -> float:
        """Jobs/s from starting the consumer with ``backlog`` jobs queued until it has started
        them all."""

        async def fill() -> None:
            async with self._queries() as queries:
                for start in range(0, backlog, _DRAIN_BATCH):
                    k = min(_DRAIN_BATCH, backlog - start)
                    await queries.enqueue(
                        ["bench"] * k, [text(start + j).encode() for j in range(k)], [0] * k
                    )

        self._stop_consumer()
        asyncio.run(fill())
        t0 = time.perf_counter()
        self._start_consumer()
        self._until(backlog)
        return backlog / (time.perf_counter() - t0)
