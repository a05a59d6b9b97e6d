"""Cross-host throughput and backlog catch-up, alone and with every process on the path under
py-spy (docs/perf-log/2026-12.md, "Cross-host throughput and catch-up").

``python -m lab.xput --store URL [--total N] [--backlog N] [--profile DIR]``:
three simulated hosts on one store, as the bench's (``alpha`` sends, ``beta`` receives with a
``listen`` sink per receiver, ``gamma`` queues the backlog with a short ``remote_ack_wait_s``).
The throughput phase sends ``--total`` messages from ``--senders`` ``AsyncClient``s with
``--window`` in flight each; the catch-up phase stops beta's relay, queues ``--backlog``
messages from gamma, starts the relay again and times it until every inbox holds them. With
``--profile DIR`` each phase runs ``py-spy record -f raw`` on both relays, both brokers, the
listeners and this process while it runs, and writes each profile's top frames beside it.
On PostgreSQL it also reports what the server counted per message over the throughput phase
(commits, row writes, index scans: how well the path batches). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from crossintercom.client import AsyncClient
from crossintercom.tools.bench import paths
from crossintercom.tools.common import prepare_store, scratch_dir
from crossintercom.tools.harness import BULK_SENDER, Cluster, SimHost

PY_SPY_RATE = 200


def _pids(alpha: SimHost, beta: SimHost) -> dict[str, int]:
    out: dict[str, int] = {"sender": os.getpid()}
    for h in (alpha, beta):
        name = "send" if h is alpha else "recv"
        if h.relay is not None and h.relay.poll() is None:
            out[f"{name}-relay"] = h.relay.pid
        broker = h.broker_pid()
        if broker is not None and broker != out.get(f"{name}-relay"):  # not hosted by the relay
            out[f"{name}-broker"] = broker
    for listener in beta.listeners:
        out[f"listen-{listener.name}"] = listener.proc.pid
    return out


@contextlib.contextmanager
def _profiled(directory: Path | None, phase: str, pids: dict[str, int]) -> Iterator[None]:
    """py-spy on every process in ``pids`` while the block runs (nothing without a directory)."""
    spy = shutil.which("py-spy")
    if directory is None or spy is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, pid in pids.items():
        out = directory / f"{phase}-{name}.txt"
        cmd = [
            spy,
            "record",
            "-p",
            str(pid),
            "-r",
            str(PY_SPY_RATE),
            "-f",
            "raw",
            "--nonblocking",
            "-o",
            str(out),
        ]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # py-spy attaches before the load starts
    try:
        yield
    finally:
        for proc in procs:
            proc.send_signal(2)  # SIGINT: py-spy writes what it has and exits
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
        for name in pids:
            path = directory / f"{phase}-{name}.txt"
            if path.exists():
                (directory / f"{phase}-{name}.top").write_text(summarise(path))


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pg_backends(store_url: str) -> dict[str, int]:
    """The server processes serving the store's database (none for SQLite)."""
    if not store_url.startswith("postgresql"):
        return {}
    import psycopg

    from crossintercom.storage import parse_store_url

    parsed = parse_store_url(store_url)
    with psycopg.connect(parsed.libpq_conninfo(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    return {f"pg-{pid}": int(pid) for (pid,) in rows}


def _pg_counts(store_url: str) -> dict[str, int]:
    """The server's own counters for the store's database: commits, and row reads/writes of
    the delivery path's tables (none for SQLite)."""
    if not store_url.startswith("postgresql"):
        return {}
    import psycopg

    from crossintercom.storage import parse_store_url

    with psycopg.connect(parse_store_url(store_url).libpq_conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        (commits,) = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone() or (0,)
        rows = conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, idx_scan FROM pg_stat_user_tables "
            "WHERE relname IN ('deliveries', 'receipts', 'messages')"
        ).fetchall()
    out = {"commits": int(commits)}
    for name, ins, upd, dele, scans in rows:
        out |= {f"{name}_ins": ins, f"{name}_upd": upd, f"{name}_del": dele, f"{name}_scans": scans}
    return out


@contextlib.contextmanager
def _store_work(out: dict[str, Any], key: str, store_url: str, count: int) -> Iterator[None]:
    """What the server counted per message while the block ran (its commits: how well the
    path batches; docs/perf-log/2026-12.md, "Cross-host throughput: the cycle")."""
    before = _pg_counts(store_url)
    yield
    time.sleep(1.2)  # the last backends' counters reach the shared view
    after = _pg_counts(store_url)
    if before:
        out.setdefault(key, []).append(
            {k: round((after.get(k, 0) - v) / count, 3) for k, v in before.items()}
        )


@contextlib.contextmanager
def _cpu(out: dict[str, Any], key: str, pids: dict[str, int], count: int) -> Iterator[None]:
    """CPU milliseconds per message each process spent while the block ran, and their sum."""
    before = {name: _cpu_s(pid) for name, pid in pids.items()}
    t0 = time.perf_counter()
    yield
    wall = time.perf_counter() - t0
    per: dict[str, float] = {}
    for name, pid in pids.items():
        per[name] = round((_cpu_s(pid) - before[name]) * 1000 / count, 3)
    pg = sum(v for k, v in per.items() if k.startswith("pg-"))
    per = {k: v for k, v in per.items() if not k.startswith("pg-")}
    per["postgres"] = round(pg, 3)
    per["total"] = round(sum(per.values()), 3)
    per["cores_busy"] = round(per["total"] * count / 1000 / wall, 2)
    out.setdefault(key, []).append(per)


def summarise(path: Path, top: int = 40) -> str:
    """The functions a raw py-spy profile spends its samples in: self and inclusive counts."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    lines = [f"{total} samples", "-- self"]
    lines += [f"{n / total:6.1%}  {f}" for f, n in own.most_common(top)] if total else []
    lines.append("-- inclusive")
    lines += [f"{n / total:6.1%}  {f}" for f, n in inclusive.most_common(top)] if total else []
    return "\n".join(lines) + "\n"


async def _run(hosts: list[SimHost], args: argparse.Namespace, sinks: list[str]) -> dict[str, Any]:
    alpha, beta, gamma = hosts
    senders = [
        AsyncClient(alpha.settings, alpha.identity(f"xput-s{k}", cwd="/"))
        for k in range(args.senders)
    ]
    filler = AsyncClient(gamma.settings, gamma.identity("xput-fill", cwd="/"))
    out: dict[str, Any] = {}
    try:
        for c in (*senders, filler):
            await c.connect()
        await paths.sequential(senders[0], beta, sinks[0], 10)  # warm-up
        await paths.sequential(filler, beta, sinks[0], 10)
        for r in range(args.rounds):
            if args.total:
                pids = {**_pids(alpha, beta), **_pg_backends(args.store_url)}
                with (
                    _store_work(out, "throughput_store_per_msg", args.store_url, args.total),
                    _profiled(args.profile, f"xput{r}", _pids(alpha, beta)),
                    _cpu(out, "throughput_cpu_ms_per_msg", pids, args.total),
                ):
                    rate, got = await paths.throughput(
                        senders, beta, sinks, args.total, args.window
                    )
                out.setdefault("throughput_msg_s", []).append(round(rate, 1))
                out.setdefault("throughput_outcomes", Counter()).update(got)
            if args.backlog:
                rate, got = await _catch_up(out, filler, (alpha, beta), sinks, args, r)
                out.setdefault("catch_up_msg_s", []).append(round(rate, 1))
                out.setdefault("catch_up_fill", Counter()).update(got)
    finally:
        for c in (*senders, filler):
            await c.close()
    return out


async def _catch_up(
    out: dict[str, Any],
    filler: AsyncClient,
    hosts: tuple[SimHost, SimHost],
    sinks: list[str],
    args: argparse.Namespace,
    r: int,
) -> tuple[float, Counter[str]]:
    """``paths.catch_up``, with the receiving side's CPU counted (and profiled) from the
    relay's start."""
    alpha, beta = hosts
    inboxes = [paths.inbox_counter(beta, n) for n in sinks]
    before = sum([await asyncio.to_thread(f) for f in inboxes])
    await asyncio.to_thread(beta.stop_relay)
    gate = asyncio.Semaphore(args.window)
    got: Counter[str] = Counter()

    async def one(i: int) -> None:
        async with gate:
            res = await filler.send(f"{sinks[i % len(sinks)]}@{beta.host_id}", f"m{i}")
            got[res.outcome.value] += 1

    await asyncio.gather(*(one(i) for i in range(args.backlog)))
    t0 = time.perf_counter()
    await asyncio.to_thread(beta.start_relay)
    pids = {k: v for k, v in _pids(alpha, beta).items() if k.startswith(("recv", "listen"))}
    pids_pg = {**pids, **_pg_backends(args.store_url)}
    with (
        _profiled(args.profile, f"catchup{r}", pids),
        _cpu(out, "catch_up_cpu_ms_per_msg", pids_pg, args.backlog),
    ):
        while sum([await asyncio.to_thread(f) for f in inboxes]) - before < args.backlog:
            await asyncio.sleep(0.01)
    # py-spy's attach second is in the time: the figure without --profile is the one to quote.
    return args.backlog / (time.perf_counter() - t0), got


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lab.xput")
    ap.add_argument("--store", help="a scratch store URL (default: a temporary SQLite file)")
    ap.add_argument("--total", type=int, default=3000, help="messages per throughput round")
    ap.add_argument("--backlog", type=int, default=0, help="messages in the catch-up backlog")
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--profile", type=Path, help="write py-spy profiles here")
    args = ap.parse_args(argv)
    sinks = [f"sink{k}" for k in range(args.receivers)]
    with scratch_dir("ci-xput-") as root:
        store = prepare_store(args.store, root)
        args.store_url = store.url
        with Cluster(root, store.url, SimHost) as cluster:
            # Fresh host ids per run: a store may hold a previous run's hosts.
            token = secrets.token_hex(2)
            hosts = [cluster.host(f"xput-{h}-{token}", relay=False) for h in ("alpha", "beta")]
            gamma = cluster.host(f"xput-gamma-{token}", relay=False)
            for h in hosts:
                h.configure(**BULK_SENDER)
            gamma.configure(**BULK_SENDER, remote_ack_wait_s=0.01)
            hosts.append(gamma)
            for h in hosts:
                h.start_relay(wait=False)
            for h in hosts:
                h.wait_relay(60)
            for name in sinks:
                hosts[1].listen(name)
            for name in sinks:
                hosts[0].wait_sees(name, hosts[1].host_id, timeout=60)
                hosts[2].wait_sees(name, hosts[1].host_id, timeout=60)
            out = asyncio.run(_run(hosts, args, sinks))
    out["store"] = store.kind
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
