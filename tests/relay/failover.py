"""Traffic across a PostgreSQL failover, for the failover tests: each host's sender sends to the
other host's sink, in a thread, and what it was told is checked against the inboxes."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from crossintercom.client import Client
from crossintercom.errors import CrossintercomError
from crossintercom.models import new_id
from tests.relay.conftest import Host

SINK = "sink"
ACKNOWLEDGED = ("delivered", "queued")


@dataclass
class Sent:
    id: str
    recipient: Host
    outcome: str
    after_failover: bool


@dataclass
class Traffic:
    """Senders from every host to every other host's sink until ``stop()``."""

    hosts: list[Host]
    sent: list[Sent] = field(default_factory=list)
    failed_over: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for i, src in enumerate(self.hosts):
            dst = self.hosts[(i + 1) % len(self.hosts)]
            client = src.client("src")
            t = threading.Thread(target=self._send, args=(client, dst), daemon=True)
            t.start()
            self._threads.append(t)

    def _send(self, client: Client, dst: Host) -> None:
        while not self._stop.is_set():
            mid, after = new_id(), self.failed_over.is_set()
            try:
                outcome = client.send(f"{SINK}@{dst.host_id}", f"seq {mid}", message_id=mid)
                told = outcome.outcome.value
            except CrossintercomError:
                told = "not_sent"
            with self._lock:
                self.sent.append(Sent(mid, dst, told, after))
            self._stop.wait(0.2 if told == "not_sent" else 0.02)

    def acknowledged(self, *, after_failover: bool | None = None) -> list[Sent]:
        with self._lock:
            return [
                s
                for s in self.sent
                if s.outcome in ACKNOWLEDGED
                and (after_failover is None or s.after_failover == after_failover)
            ]

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)


@dataclass
class Tally:
    acknowledged: int
    lost: list[str]
    duplicated: list[str]
    phantom_not_sent: list[str]
    outcomes: Counter[str]


def tally(traffic: Traffic) -> Tally:
    """What the senders were told against what the sinks' inboxes hold now."""
    inboxes = {h.host_id: h.inbox(SINK) for h in traffic.hosts}
    lost, phantom = [], []
    for s in traffic.sent:
        copies = inboxes[s.recipient.host_id][s.id]
        if s.outcome in ACKNOWLEDGED and copies == 0:
            lost.append(s.id)
        if s.outcome == "not_sent" and copies:
            phantom.append(s.id)
    duplicated = [mid for inbox in inboxes.values() for mid, n in inbox.items() if n > 1]
    return Tally(
        len(traffic.acknowledged()),
        lost,
        duplicated,
        phantom,
        Counter(s.outcome for s in traffic.sent),
    )
