"""Several processes at once: producers, racing relays of one host id, a reader killed mid-batch."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from crossintercom.storage import Ack, OutboundItem, open_store
from crossintercom.storage.blocking import run
from tests.storage.conftest import spawn_worker
from tests.storage.workers import message_id, session_for

PRODUCERS = 4
PER_PRODUCER = 200
HOST = "racer@b"


def _wait_until_drained(url: str, timeout: float = 90.0) -> None:
    store = run(open_store(url))
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            gen = max(h.generation for h in run(store.hosts()) if h.host_id == HOST)
            if not run(store.fetch_inbound(HOST, gen, limit=1)):
                return
            time.sleep(0.2)
        raise AssertionError("relay did not drain the queue in time")
    finally:
        run(store.aclose())


def test_producers_and_racing_relays_deliver_exactly_once(store_url: str, tmp_path: Path) -> None:
    total = PRODUCERS * PER_PRODUCER
    ids_file = tmp_path / "ids"
    ids_file.write_text(
        "".join(
            f"{message_id(p, n)} {session_for(n)}\n"
            for p in range(PRODUCERS)
            for n in range(PER_PRODUCER)
        )
    )
    store = run(open_store(store_url))
    try:
        old = run(store.claim_host(HOST))
        new = run(store.claim_host(HOST))
    finally:
        run(store.aclose())
    stop = tmp_path / "stop"
    stale = spawn_worker("relay", store_url, HOST, str(old), str(stop), str(ids_file))
    current = spawn_worker("relay", store_url, HOST, str(new), str(stop), "-")
    producers = [
        spawn_worker("produce", store_url, str(p), str(PER_PRODUCER), HOST)
        for p in range(PRODUCERS)
    ]
    written = 0
    for proc in producers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        written += json.loads(out)["written"]
    assert written == total

    _wait_until_drained(store_url)
    stop.touch()
    stale_out, stale_err = stale.communicate(timeout=60)
    current_out, current_err = current.communicate(timeout=60)
    assert stale.returncode == 0, stale_err
    assert current.returncode == 0, current_err
    stale_report, current_report = json.loads(stale_out), json.loads(current_out)

    handed = current_report["handed"]
    delivered_twice = len(handed) - len(set(handed))
    store = run(open_store(store_url))
    try:
        states = [
            state
            for p in range(PRODUCERS)
            for n in range(PER_PRODUCER)
            for state in run(store.get_message(message_id(p, n))).states.values()  # type: ignore[union-attr]
        ]
    finally:
        run(store.aclose())
    lost = total - states.count("delivered")
    print(
        f"\n{store_url.split(':', maxsplit=1)[0]}: attempted={total} written={written} "
        f"delivered={current_report['changed']} lost={lost} delivered_twice={delivered_twice} "
        f"stale_changed={stale_report['changed']} stale_handed={len(stale_report['handed'])}"
    )
    assert stale_report == {"handed": [], "changed": 0}
    assert current_report["changed"] == total
    assert len(set(handed)) == total
    assert delivered_twice == 0
    assert lost == 0


def test_reader_killed_mid_batch_leaves_nothing_undeliverable(store_url: str) -> None:
    host = "killed@b"
    store = run(open_store(store_url))
    try:
        run(
            store.enqueue(
                [OutboundItem(f"k{i}", "a", host, "s1", "d" * 64, {"n": i}, 1) for i in range(200)]
            )
        )
        reader = spawn_worker("slow-reader", store_url, host)
        assert reader.stdout is not None
        assert reader.stdout.readline().startswith("claimed 200")
        acked = 0
        while acked < 20:
            line = reader.stdout.readline()
            assert line.startswith("acked"), line
            acked += 1
        reader.send_signal(signal.SIGKILL)
        reader.communicate(timeout=30)

        gen = run(store.claim_host(host))  # the next relay of the host
        rest = run(store.fetch_inbound(host, gen, limit=1000))
        assert 0 < len(rest) <= 180
        assert run(
            store.ack(host, gen, [Ack(r.message_id, "s1", "delivered") for r in rest])
        ) == len(rest)
        states = [run(store.get_message(f"k{i}")).states["s1"] for i in range(200)]  # type: ignore[union-attr]
        assert states == ["delivered"] * 200
    finally:
        run(store.aclose())
