"""Randomized crash soak for the same-host delivery contract (docs/delivery.md).

Several durable sessions, each in its own process, send messages to one another while the broker
is SIGKILLed at random (seeded) moments; the clients respawn it and retry with the same message
id. Afterwards every session resumes once (re-registers, so anything queued for it is handed
over) and the checker compares every ``SendResult`` with every inbox:

* lost: a message the sender was told ``delivered``/``queued`` that is not in its recipient's
  inbox exactly once;
* duplicated: an inbox holding one message (by id or by its unique payload) more than once;
* phantom: a message the sender was told ``not_sent``/``refused`` that is in an inbox anyway.

Usable from the tests (``run_soak``) and by hand::

    python -m tests.soak --messages 5000 --sessions 4 --kills 10 --seed 7   # from the checkout

prints ``attempted / acknowledged / lost / duplicated`` and exits 1 when anything was lost,
duplicated or phantom.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossintercom.config import load_settings
from crossintercom.local_broker.process.spawn import can_connect
from crossintercom.tools.harness import BULK_SENDER
from tests.procs import (
    HOST_ID,
    BrokerProc,
    inbox_rows,
    live_broker_pid,
    make_env,
    sigkill_broker,
    wait_for,
)

ACKNOWLEDGED = ("delivered", "queued")


# --- the worker: one session in its own process ---------------------------------------------------


async def _worker(args: argparse.Namespace) -> None:
    from crossintercom.client import AsyncClient, Identity

    cfg = load_settings()
    me = Identity.named(cfg, args.name)
    peers = [p for p in args.peers.split(",") if p != args.name]
    rng = random.Random(f"{args.seed}:{args.name}")
    plan = [(i, rng.choice(peers)) for i in range(args.count)]
    out = Path(args.out)
    results = (out / f"{args.name}.results").open("a", buffering=1)
    received = (out / f"{args.name}.received").open("a", buffering=1)
    client = AsyncClient(cfg, me)
    await client.connect()
    (out / f"{args.name}.ready").touch()  # the kills start once every worker is connected

    async def drain() -> None:
        while True:
            item = await client.incoming.get()
            if item.message is not None:
                received.write(json.dumps([item.message.id, list(item.message.flags)]) + "\n")

    drainer = asyncio.create_task(drain())
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for item in plan:
        queue.put_nowait(item)

    async def sender() -> None:
        while not queue.empty():
            i, to = queue.get_nowait()
            text = f"soak {args.name}#{i} -> {to}"
            res = await client.send(to, text)
            row = {"id": res.id, "from": args.name, "to": to, "n": i, "text": text}
            row |= {"outcome": res.outcome.value, "code": res.code}
            results.write(json.dumps(row) + "\n")

    await asyncio.gather(*(sender() for _ in range(args.concurrency)))
    results.write(json.dumps({"done": True}) + "\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    drainer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await drainer
    await client.close()
    results.close()
    received.close()


# --- the driver and the checker -----------------------------------------------------------------


@dataclass
class SoakReport:
    attempted: int = 0
    acknowledged: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    duplicated: int = 0
    phantom: int = 0
    kills: int = 0
    unknown_in_inbox: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.phantom == 0

    def summary(self) -> str:
        o = self.outcomes
        return (
            f"attempted {self.attempted} / acknowledged {self.acknowledged} / lost {self.lost} "
            f"/ duplicated {self.duplicated}\n"
            f"  delivered {o['delivered']}, queued {o['queued']}, unknown {o['unknown']} "
            f"({self.unknown_in_inbox} of them arrived), not_sent {o['not_sent']}, "
            f"refused {o['refused']}; phantom {self.phantom}; broker kills {self.kills}"
        )


def _read_jsonl(path: Path) -> list[Any]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line cut by a kill is no result
            out.append(json.loads(line))
    return out


def check(home: Path, out: Path, names: list[str], host_id: str = HOST_ID) -> SoakReport:
    """Compare every SendResult with every inbox."""
    from crossintercom.models import durable_session_id

    rep = SoakReport()
    sid = {n: durable_session_id(host_id, n) for n in names}
    holdings: dict[str, Counter[str]] = {}
    texts: dict[str, Counter[str]] = {}
    for n in names:
        rows = [r for r in inbox_rows(home, sid[n]) if r[1] == "message"]
        holdings[n] = Counter(r[0] for r in rows)
        texts[n] = Counter(str(r[2].get("message")) for r in rows)
        for mid, c in holdings[n].items():
            if c > 1:
                rep.duplicated += c - 1
                rep.problems.append(f"{n}'s inbox holds {mid} {c} times")
        for text, c in texts[n].items():
            if c > 1:
                rep.duplicated += c - 1
                rep.problems.append(f"{n}'s inbox holds payload {text!r} {c} times")
        # The client hands each message to the application once (a repeat is only re-acked).
        got = Counter(json.loads(line)[0] for line in _lines(out / f"{n}.received"))
        for mid, c in got.items():
            if c > 1:
                rep.duplicated += c - 1
                rep.problems.append(f"{n} was handed {mid} {c} times")
    for n in names:
        for row in _read_jsonl(out / f"{n}.results"):
            if "outcome" not in row:
                continue
            rep.attempted += 1
            outcome = row["outcome"]
            rep.outcomes[outcome] += 1
            held = holdings[row["to"]][row["id"]]
            if outcome in ACKNOWLEDGED:
                rep.acknowledged += 1
                if held != 1:
                    rep.lost += 1
                    rep.problems.append(f"{row} is held {held} times by {row['to']}")
            elif outcome in ("not_sent", "refused") and held:
                rep.phantom += 1
                rep.problems.append(f"{row} was told {outcome} but {row['to']} holds it")
            elif outcome == "unknown" and held:
                rep.unknown_in_inbox += 1
    return rep


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _done(out: Path, name: str) -> bool:
    return any(r.get("done") for r in _read_jsonl(out / f"{name}.results"))


def _progress(out: Path, names: list[str]) -> int:
    return sum(len(_lines(out / f"{n}.results")) for n in names)


def register_all(home: Path, names: list[str]) -> None:
    from crossintercom.client import Client, Identity

    cfg = load_settings(make_env(home, _host_id(home)))
    for n in names:
        with Client(cfg, Identity.named(cfg, n)):
            pass


def resume_all(home: Path, names: list[str], timeout: float = 60) -> None:
    """Register every session once more, so whatever is queued for it is handed over and acked."""
    from crossintercom.client import Client, Identity

    cfg = load_settings(make_env(home, _host_id(home)))
    for n in names:
        with Client(cfg, Identity.named(cfg, n)) as client:
            client.status()  # registered (the backlog is written at registration)
            wait_for(
                lambda: queued_for(home, client.aio.identity.id) == 0,  # type: ignore[union-attr]
                timeout,
                f"{n}'s backlog to drain",
            )


def queued_for(home: Path, session_id: str) -> int:
    db = sqlite3.connect(f"file:{home / 'broker.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        row = db.execute("SELECT count(*) FROM queue WHERE recipient = ?", (session_id,))
        return int(row.fetchone()[0])
    finally:
        db.close()


def _host_id(home: Path) -> str:
    marker = home / ".soak-host"
    return marker.read_text().strip() if marker.exists() else HOST_ID


def run_soak(
    home: Path,
    *,
    messages: int = 2000,
    sessions: int = 4,
    kills: int = 4,
    seed: int = 1,
    concurrency: int = 8,
    timeout: float = 150,
    log: Any = None,
) -> SoakReport:
    """Drive the soak in ``home`` (a short dir under /tmp) and return the checker's report."""
    rng = random.Random(seed)
    names = [f"s{i}" for i in range(sessions)]
    env = make_env(home)
    (home / ".soak-host").parent.mkdir(parents=True, exist_ok=True)
    (home / ".soak-host").write_text(HOST_ID)
    # Bulk senders, not agents in a loop: the per-sender rate limit is lifted.
    (home / "config.json").write_text(json.dumps(BULK_SENDER))
    out = home / "soak-out"
    out.mkdir(exist_ok=True)
    per = [messages // sessions + (1 if i < messages % sessions else 0) for i in range(sessions)]
    # Kill points: when this many results have been written, plus a random extra delay.
    points = sorted(rng.sample(range(messages // 20, messages * 9 // 10), kills)) if kills else []
    broker = BrokerProc(env)  # the first broker; later ones are spawned by the clients
    workers: list[subprocess.Popen[bytes]] = []
    report = SoakReport()
    try:
        register_all(home, names)  # every session is known before anyone sends to it
        for name, count in zip(names, per, strict=True):
            cmd = [sys.executable, "-m", "tests.soak", "--worker", "--name", name]
            cmd += ["--peers", ",".join(names), "--count", str(count), "--seed", str(seed)]
            cmd += ["--out", str(out), "--concurrency", str(concurrency)]
            workers.append(
                subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
            )
        deadline = time.monotonic() + timeout
        # A worker's first connect is not retried: a kill before every worker has connected
        # would fail the run instead of testing the delivery (fast workers reach the first kill
        # point while a slow one is still starting).
        while not all((out / f"{n}.ready").exists() for n in names):
            _check_workers(workers, deadline)
            time.sleep(0.01)
        for point in points:
            while _progress(out, names) < point:
                _check_workers(workers, deadline)
                time.sleep(0.01)
            # Each kill hits a serving broker: wait for the clients to have respawned one.
            while not (live_broker_pid(home) and can_connect(home / "broker.sock")):
                _check_workers(workers, deadline)
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.05))
            if sigkill_broker(home) is not None:
                report.kills += 1
                if log:
                    log(f"killed the broker after {_progress(out, names)} results")
        while not all(_done(out, n) for n in names):
            _check_workers(workers, deadline)
            time.sleep(0.05)
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            _, err = w.communicate(timeout=30)
            if w.returncode != 0:
                raise RuntimeError(f"soak worker failed ({w.returncode}): {err.decode()[-2000:]}")
        resume_all(home, names)
        checked = check(home, out, names)
        checked.kills = report.kills
        return checked
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.communicate(timeout=10)
        broker.stop()
        sigkill_broker(home)


def _check_workers(workers: list[subprocess.Popen[bytes]], deadline: float) -> None:
    for w in workers:
        if w.poll() is not None and w.returncode != 0:
            err = w.stderr.read()[-2000:].decode(errors="replace") if w.stderr else ""
            raise RuntimeError(f"a soak worker exited with {w.returncode}: {err}")
    if time.monotonic() > deadline:
        raise TimeoutError("the soak did not finish in time")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8, help="sends in flight per session")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--keep", action="store_true", help="keep the runtime dir for inspection")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--peers", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        asyncio.run(_worker(args))
        return 0
    if args.sessions < 2:
        ap.error("--sessions must be at least 2")
    home = Path(tempfile.mkdtemp(prefix="cf-soak-", dir="/tmp"))
    try:
        rep = run_soak(
            home,
            messages=args.messages,
            sessions=args.sessions,
            kills=args.kills,
            seed=args.seed,
            concurrency=args.concurrency,
            timeout=args.timeout,
            log=lambda s: print(s, file=sys.stderr),
        )
    finally:
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
        else:
            print(f"runtime dir kept: {home}", file=sys.stderr)
    print(rep.summary())
    for p in rep.problems[:20]:
        print(f"  problem: {p}")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
