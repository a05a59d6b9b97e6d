"""`crossintercom demo`: a real exchange between two sessions, printed as it happens."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from crossintercom.client import Client, Identity
from crossintercom.config import Settings, load_settings
from crossintercom.models import SendResult


class Demo:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.events: list[dict[str, Any]] = []

    def say(self, step: str, text: str, **data: Any) -> None:
        event = {"step": step, "text": text, **data}
        self.events.append(event)
        if self.as_json:
            click.echo(json.dumps(event))
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


@contextlib.contextmanager
def _host(root: Path, host_id: str) -> Iterator[Settings]:
    """A simulated host: its own runtime dir and broker, stopped on exit."""
    cfg = load_settings(env={}, home=str(root / host_id), host_id=host_id)
    try:
        yield cfg
    finally:
        pid_file = cfg.file("broker.pid")
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


def run_demo(as_json: bool = False) -> None:
    demo = Demo(as_json)
    root = Path(tempfile.mkdtemp(prefix="ci-demo-"))
    try:
        with _host(root, "alpha") as cfg:
            _exchange(demo, cfg)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _exchange(demo: Demo, cfg: Settings) -> None:
    demo.say("start", f"runtime dir {cfg.home}, host {cfg.host_id}; the broker starts on demand")
    worker_id = Identity.named(cfg, "worker", cwd="/")
    worker = Client(cfg, worker_id).connect()
    planner = Client(cfg, Identity.named(cfg, "planner", cwd="/")).connect()
    demo.say("register", "worker and planner registered (durable mailboxes)")

    t0 = time.perf_counter()
    result = planner.send("worker", "Please look at the failing test in tests/test_io.py")
    demo.outcome("send", "planner -> worker", result, t0)
    got = worker.next_incoming(5)
    assert got is not None and got.message is not None
    demo.say("receive", f"worker saved and got: {got.message.text!r}")

    def answer() -> None:
        inc = worker.next_incoming(10)
        if inc is None or inc.message is None:
            return
        demo.say("receive", f"worker got an ask: {inc.message.text!r}")
        r = worker.reply("Fixed: the fixture closed the file too early.")
        demo.say("reply", f"worker replied: {r.outcome.value}")

    replier = threading.Thread(target=answer)
    replier.start()
    t0 = time.perf_counter()
    asked = planner.ask("worker", "Is the test fixed?", timeout=30)
    replier.join()
    demo.outcome("ask", "planner asked worker", asked, t0)
    demo.say("answer", f"reply for planner: {asked.reply.text if asked.reply else None!r}")

    worker.close()
    demo.say("offline", "worker went away")
    t0 = time.perf_counter()
    queued = planner.send("worker", "When you are back: rebase on main.")
    demo.outcome("send", "planner -> absent worker", queued, t0)
    worker = Client(cfg, worker_id).connect()
    back = worker.next_incoming(5)
    text = back.message.text if back and back.message else None
    flags = ", ".join(back.message.flags) if back and back.message else ""
    demo.say("resume", f"worker came back and got: {text!r} [{flags}]")
    for client in (worker, planner):
        client.close()
    demo.say("done", "exchange complete")
