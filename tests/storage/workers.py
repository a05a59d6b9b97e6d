"""Child processes for the store tests: producers, relays, waiters (run as separate processes
so locks, connections and wake-ups cross real process boundaries)."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from crossintercom.storage import Ack, OutboundItem, open_store
from crossintercom.storage.blocking import run

SESSIONS = 3


def message_id(producer: int, n: int) -> str:
    return f"p{producer}-{n}"


def session_for(n: int) -> str:
    return f"s{n % SESSIONS}"


def item(producer: int, n: int, recipient_host: str) -> OutboundItem:
    payload = {"type": "message", "id": message_id(producer, n), "message": f"hello {n}"}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return OutboundItem(
        message_id(producer, n),
        f"sender{producer}",
        recipient_host,
        session_for(n),
        digest,
        payload,
        20,
    )


def produce(url: str, producer: int, count: int, recipient_host: str) -> None:
    store = run(open_store(url))
    try:
        written = 0
        for start in range(0, count, 10):
            batch = [
                item(producer, n, recipient_host) for n in range(start, min(start + 10, count))
            ]
            written += sum(r.inserted for r in run(store.enqueue(batch)))
        print(json.dumps({"written": written}), flush=True)
    finally:
        run(store.aclose())


def relay(url: str, host: str, generation: int, stop_file: str, ids_file: str) -> None:
    """Claim and ack until told to stop. A stale relay also tries to ack every known id, to
    prove the fence holds for writes and not only for reads."""
    known: list[tuple[str, str]] = []
    if ids_file != "-":
        known = [tuple(line.split()) for line in Path(ids_file).read_text().splitlines()]  # type: ignore[misc]
    store = run(open_store(url))
    handed: list[str] = []
    changed = 0
    writes_refused = 0
    try:
        while not Path(stop_file).exists():
            rows = run(store.fetch_inbound(host, generation, limit=50))
            handed += [f"{r.message_id}/{r.recipient_session}" for r in rows]
            acks = [Ack(r.message_id, r.recipient_session, "delivered") for r in rows]
            acks += [Ack(m, s, "delivered") for m, s in known[:200]]
            if acks:
                n = run(store.ack(host, generation, acks))
                changed += n
                writes_refused += len(acks) - n
            if not run(store.heartbeat(host, generation)):
                writes_refused += 1
            if not rows:
                time.sleep(0.05)
        print(json.dumps({"handed": handed, "changed": changed}), flush=True)
    finally:
        run(store.aclose())


def slow_reader(url: str, host: str) -> None:
    """Ack one row at a time, slowly, so the test can kill it mid-batch."""
    store = run(open_store(url))
    generation = run(store.claim_host(host))
    rows = run(store.fetch_inbound(host, generation, limit=1000))
    print(f"claimed {len(rows)}", flush=True)
    for r in rows:
        run(store.ack(host, generation, [Ack(r.message_id, r.recipient_session, "delivered")]))
        print(f"acked {r.message_id}", flush=True)
        time.sleep(0.02)


def wait(url: str, host: str, timeout: float, polling: bool) -> None:
    store = run(open_store(url, polling_observer=polling))
    try:
        with store.waiter(host) as waiter:
            assert waiter.wait(1.0), "the first wait reports a wake-up for the catch-up query"
            print("ready", flush=True)
            start = time.monotonic()
            woken = waiter.wait(timeout)
            print(f"{'woken' if woken else 'timeout'} {time.monotonic() - start:.3f}", flush=True)
    finally:
        run(store.aclose())


def main(argv: list[str]) -> None:
    cmd, *args = argv
    if cmd == "produce":
        produce(args[0], int(args[1]), int(args[2]), args[3])
    elif cmd == "relay":
        relay(args[0], args[1], int(args[2]), args[3], args[4])
    elif cmd == "slow-reader":
        slow_reader(args[0], args[1])
    elif cmd == "wait":
        wait(args[0], args[1], float(args[2]), args[3] == "polling")
    else:
        raise SystemExit(f"unknown worker {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
