"""`bench --polling`'s phase (crossintercom/tools/bench/polling.py): two relays told to poll their
doorbells deliver every timed send, and the figure stands beside the inotify one."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from crossintercom.storage import migrate
from crossintercom.tools.bench.polling import polling_figure, polling_sends


def test_polling_relays_are_timed_one_way() -> None:
    root = Path(tempfile.mkdtemp(prefix="cibp-", dir="/tmp"))  # short: AF_UNIX paths
    try:
        url = f"sqlite:///{root / 'mailbox.sqlite'}"
        migrate.upgrade(url)
        (root / "hosts").mkdir()
        timed = polling_sends(root / "hosts", url, sends=3, warm_up=1, token="t")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert len(timed.one_way) == 3 and all(s > 0 for s in timed.one_way)
    assert timed.outcomes["delivered"] + timed.outcomes["queued"] == 3
    figure = polling_figure(timed.one_way, inotify_p50_ms=10.0)
    assert (figure.path, figure.metric, figure.pairing) == (
        "cross-host sqlite polling",
        "one-way p50",
        "one-way",
    )
    assert figure.crossintercom > 0 and figure.ratio > 0
