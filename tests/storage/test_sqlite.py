"""SQLite on a shared filesystem: doorbells cross processes, also with the polling observer."""

from __future__ import annotations

from pathlib import Path

from crossintercom.storage import OutboundItem, open_store
from crossintercom.storage.blocking import run
from crossintercom.storage.wakeup import doorbell_dir
from tests.storage.conftest import spawn_worker


def test_doorbell_wakes_a_polling_reader_in_another_process(sqlite_url: str) -> None:
    host = "bob@b"
    reader = spawn_worker("wait", sqlite_url, host, "10", "polling")
    store = run(open_store(sqlite_url))
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "ready"
        gen = run(store.claim_host(host))
        run(store.enqueue([OutboundItem("m1", "a", host, "s1", "d" * 64, {"x": 1}, 1)]))
        out, err = reader.communicate(timeout=15)
        verdict, elapsed = out.split()
        assert verdict == "woken", err
        assert float(elapsed) < 2.0  # one polling interval plus slack
        assert [r.message_id for r in run(store.fetch_inbound(host, gen))] == ["m1"]
    finally:
        reader.kill()
        reader.wait()
        run(store.aclose())
    db_path = Path(sqlite_url.removeprefix("sqlite:///"))
    assert doorbell_dir(db_path).is_dir()
