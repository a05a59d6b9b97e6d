"""A recipient host whose disk fills up or whose inbox turns read-only, then recovers.

Real faults: the recipient host's runtime dir is a small tmpfs the test mounts (and fills with
a file, then frees), and a read-only inbox is an immutable file (``chattr +i``; root ignores
file modes, and a read-only remount is refused while files are open for writing). Every
acknowledged message must arrive exactly once once the fault is gone, by itself, within
seconds; ``status`` names the fault while it lasts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crossintercom.testhooks import FAULTS_ENV

# Never a real disk: it refuses anything but a small tmpfs (this test mounts one).
from crossintercom.tools.chaos.disk import fill
from tests.relay.conftest import Cluster, Host, Listener, wait_for
from tests.relay.faultkit import ACKED, report, settle, stream
from tests.relay.frozen import stopped

# Mail resumes by itself this soon after the fault is gone (the client retries every 5 s).
RECOVERY_S = 30.0

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("chattr") is None, reason="needs root (mount, chattr)"
)


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, str], None]]:
    """Mount a small tmpfs on a directory; unmounted at teardown."""
    mounted: list[Path] = []

    def mount(path: Path, size: str = "8m") -> None:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            check=True,
        )
        mounted.append(path)

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=False)


def warnings(host: Host) -> list[str]:
    found: list[str] = host.cli_json("status")["warnings"]
    return found


def chattr(flag: str, *paths: Path) -> None:
    subprocess.run(["chattr", flag, *map(str, paths)], check=True)


def _recipient_on_tmpfs(cluster: Cluster, mount: Callable[[Path, str], None]) -> tuple[Host, Host]:
    a = cluster.host("A", remote_ack_wait_s=1)
    b = cluster.host("B", relay=False)
    mount(b.home, "8m")
    b.start_relay()
    return a, b


def test_disk_full_then_freed_mail_resumes_exactly_once(
    cluster: Cluster, tmpfs: Callable[[Path, str], None]
) -> None:
    a, b = _recipient_on_tmpfs(cluster, tmpfs)
    worker: Listener = b.listen("worker")
    a.wait_sees("worker", "B")
    remote = a.client("boss")
    local = b.client("mate")
    assert remote.send("worker@B", "before").outcome.value == "delivered"

    filler = fill(b.home)
    wait_for(lambda: any("disk full" in w for w in warnings(b)), 10, "status to say disk full")
    during = stream(remote, "worker@B", 20, "remote while full", concurrency=4)
    during |= stream(local, "worker", 10, "local while full", concurrency=2)
    # Nothing may be told delivered that was not saved; the rest waits or was not sent.
    assert set(during.values()) <= {"delivered", "queued", "not_sent"}, during

    # The recipient's relay says which message waits and why (the broker's own error).
    wait_for(
        lambda: any(
            f"id={m}" in line and "error=" in line and "disk is full" in line
            for m in during
            for line in b.relay_log().splitlines()
        ),
        15,
        "the relay to log a waiting message with its id and error",
    )

    filler.unlink()
    freed = time.monotonic()
    wait_for(lambda: not warnings(b), 10, "the disk-full warning to clear")
    after = stream(remote, "worker@B", 5, "remote after", concurrency=2)
    after |= stream(local, "worker", 5, "local after", concurrency=2)
    assert set(after.values()) <= set(ACKED), after

    outcomes = during | after
    acked = {m for m, o in outcomes.items() if o in ACKED}
    held = settle(b, "worker", acked, worker, timeout=RECOVERY_S)
    resumed = round(time.monotonic() - freed - 1.0, 1)  # settle waits 1 s for late copies
    lost, dups = report("disk full on the recipient host", outcomes, acked, held, resumed_s=resumed)
    assert (lost, dups) == (0, 0)
    printed = worker.message_ids()
    assert all(printed[m] == 1 for m in acked), "a message was printed twice"


def test_broker_killed_on_a_full_disk_is_started_again_once_freed(
    cluster: Cluster, tmpfs: Callable[[Path, str], None]
) -> None:
    """Starting the broker again fails while the disk is full (its log, its spawn lock): the
    relay and the listener keep trying, rather than giving up their reconnecting for good,
    and the mail the store kept arrives once the disk is freed."""
    a, b = _recipient_on_tmpfs(cluster, tmpfs)
    worker: Listener = b.listen("worker")
    a.wait_sees("worker", "B")
    remote = a.client("boss")
    assert remote.send("worker@B", "before").outcome.value == "delivered"

    filler = fill(b.home)
    assert b.kill_broker()
    wait_for(
        lambda: "could not start the broker" in b.relay_log(),
        15,
        "the relay to fail starting the broker on the full disk",
    )
    during = stream(remote, "worker@B", 10, "while full, no broker", concurrency=2)
    assert set(during.values()) & set(ACKED), during
    filler.unlink()
    freed = time.monotonic()

    acked = {m for m, o in during.items() if o in ACKED}
    held = settle(b, "worker", acked, worker, timeout=RECOVERY_S)
    resumed = round(time.monotonic() - freed - 1.0, 1)
    lost, dups = report("broker killed on a full disk", during, acked, held, resumed_s=resumed)
    assert (lost, dups) == (0, 0)
    assert worker.alive(), f"the listener died: {worker.stderr}"


def test_outcome_stands_when_the_disk_fills_before_it_is_recorded(
    cluster: Cluster, tmpfs: Callable[[Path, str], None]
) -> None:
    """The message was delivered, then the disk filled before the broker recorded the outcome
    for deduplication: the sender is told ``delivered``, not ``unknown: internal``."""
    b = cluster.host("B", relay=False)
    tmpfs(b.home, "8m")
    # the broker stops itself between delivering and recording, so the disk fills right there
    b.env[FAULTS_ENV] = "stop:broker_before_settle"
    b.start_relay()
    worker = b.listen("worker")
    mate = b.client("mate")
    answers: list[Any] = []
    sending = threading.Thread(target=lambda: answers.append(mate.send("worker", "then full")))
    sending.start()
    pid = b.broker_pid()
    assert pid is not None
    wait_for(lambda: stopped(pid), 30, "the broker to stop before recording the outcome")
    filler = fill(b.home)
    os.kill(pid, signal.SIGCONT)
    sending.join(30)
    [answer] = answers
    assert (answer.outcome.value, answer.code) == ("delivered", None), answer
    filler.unlink()
    assert b.inbox("worker")[answer.id] == 1
    assert worker.alive()


def test_immutable_inbox_then_writable_mail_resumes_exactly_once(cluster: Cluster) -> None:
    a = cluster.host("A", remote_ack_wait_s=1)
    b = cluster.host("B")
    worker: Listener = b.listen("worker")
    a.wait_sees("worker", "B")
    remote = a.client("boss")
    local = b.client("mate")
    assert remote.send("worker@B", "before").outcome.value == "delivered"
    inbox_files = sorted(b.settings.inbox_dir.glob(f"{b.session_id('worker')}.sqlite*"))
    assert inbox_files

    chattr("+i", *inbox_files)
    try:
        during = stream(remote, "worker@B", 20, "remote while read-only", concurrency=4)
        during |= stream(local, "worker", 10, "local while read-only", concurrency=2)
        assert set(during.values()) <= {"queued", "not_sent"}, during
        wait_for(
            lambda: any("inbox unwritable" in w and "worker" in w for w in warnings(b)),
            15,
            "status to say the inbox is unwritable",
        )
        # Held until the queued messages were handed over again (the client re-registers
        # after 5 s) and refused again: a refusal on resume must leave them queued too.
        tries = len([o for o in during.values() if o == "queued"]) + 1
        wait_for(
            lambda: worker.stderr.count("cannot save message") > tries,
            20,
            "the queued messages to be handed over again",
        )
        assert worker.alive(), f"the listener died: {worker.stderr}"
    finally:
        chattr("-i", *inbox_files)
    writable = time.monotonic()

    after = stream(remote, "worker@B", 5, "remote after", concurrency=2)
    outcomes = during | after
    acked = {m for m, o in outcomes.items() if o in ACKED}
    held = settle(b, "worker", acked, worker, timeout=RECOVERY_S)
    resumed = round(time.monotonic() - writable - 1.0, 1)
    lost, dups = report(
        "immutable inbox on the recipient host", outcomes, acked, held, resumed_s=resumed
    )
    assert (lost, dups) == (0, 0)
    assert all(worker.message_ids()[m] == 1 for m in acked), "a message was printed twice"
    assert "cannot save message" in worker.stderr
    wait_for(lambda: not warnings(b), 20, "the unwritable-inbox warning to clear")


def test_fatal_signal_in_a_listener_is_reported(cli_env: dict[str, str]) -> None:
    """Whatever else sends one (a mapped file that fails), a SIGBUS is never a silent death."""
    worker = Listener(cli_env, "worker")
    os.kill(worker.proc.pid, signal.SIGBUS)
    worker.proc.wait(10)
    wait_for(lambda: "Bus error" in worker.stderr, 5, "the listener to report the signal")
    assert "Fatal Python error" in worker.stderr
