"""`crossintercom demo`: two simulated hosts exchange messages through a shared SQLite file.

Each host is what a machine runs (``harness.SimHost``): its own runtime dir, host id, broker and
relay process. The store is a temporary SQLite file (the embedded default). `planner` lives on
alpha, `worker` on beta. Everything the demo started is stopped before it returns.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import click

from crossintercom.models import SendResult
from crossintercom.tools.common import prepare_store, scratch_dir
from crossintercom.tools.harness import Cluster, SimHost


class Narrator:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.t0 = time.perf_counter()

    def say(self, step: str, text: str, **data: Any) -> None:
        if self.as_json:
            click.echo(json.dumps({"step": step, "text": text, **data}))
        else:
            click.echo(f"{step:>9}  {text}")

    def outcome(self, step: str, what: str, result: SendResult, started: float) -> None:
        ms = (time.perf_counter() - started) * 1000
        self.say(
            step,
            f"{what}: {result.outcome.value} in {ms:.1f} ms",
            id=result.id,
            outcome=result.outcome.value,
            ms=round(ms, 2),
        )


def run_demo(as_json: bool = False) -> None:
    say = Narrator(as_json)
    with scratch_dir("ci-demo-") as root:
        store = prepare_store(None, root)
        say.say("store", "shared mailbox: a temporary SQLite file (schema created)")
        with Cluster(root, store.url, SimHost) as cluster:
            alpha, beta = cluster.up("alpha", "beta")
            say.say("hosts", "alpha and beta each run a broker and a relay")
            _exchange(say, alpha, beta)
    say.say("done", "everything the demo started has stopped")


def _exchange(say: Narrator, alpha: SimHost, beta: SimHost) -> None:
    worker = beta.client("worker", cwd="/srv/app")
    planner = alpha.client("planner", cwd="/srv/app")
    alpha.wait_sees("worker", "beta", timeout=20)
    say.say(
        "list",
        "alpha sees: "
        + ", ".join(
            f"{s.display_name}@{s.host} ({'online' if s.online else 'offline'})"
            for s in planner.list_sessions()
        ),
    )

    t0 = time.perf_counter()
    sent = planner.send("worker", "Please look at the failing test in tests/test_io.py")
    say.outcome("send", "planner@alpha -> worker@beta", sent, t0)
    got = worker.next_incoming(10)
    if got is not None and got.message is not None:
        say.say("receive", f"worker saved and got: {got.message.text!r}")

    def answer() -> None:
        inc = worker.next_incoming(20)
        if inc is None or inc.message is None:
            return
        say.say("receive", f"worker got an ask: {inc.message.text!r}")
        r = worker.reply("Fixed: the fixture closed the file too early.")
        say.say("reply", f"worker replied: {r.outcome.value}")

    replier = threading.Thread(target=answer)
    replier.start()
    t0 = time.perf_counter()
    asked = planner.ask("worker", "Is the test fixed?", timeout=30)
    replier.join()
    say.outcome("ask", "planner asked worker (round trip with the reply)", asked, t0)
    say.say("answer", f"reply for planner: {asked.reply.text if asked.reply else None!r}")

    worker.close()
    say.say("offline", "worker left beta")
    t0 = time.perf_counter()
    queued = planner.send("worker", "When you are back: rebase on main.")
    say.outcome("send", "planner -> absent worker", queued, t0)
    worker = beta.client("worker", cwd="/srv/app")
    back = worker.next_incoming(15)
    if back is not None and back.message is not None:
        flags = ", ".join(back.message.flags)
        say.say("resume", f"worker came back and got: {back.message.text!r} [{flags}]")
    else:
        say.say("resume", "worker came back but the queued message did not arrive in time")
    for client in (worker, planner):
        client.close()
