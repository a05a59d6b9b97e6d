"""Logs as text or JSON (`--log-format`, CROSSINTERCOM_LOG_FORMAT): one JSON object per line
with time, level, logger, event and the structured fields; no password in either format."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from crossintercom.relay.logs import JsonFormatter, TextFormatter
from tests.procs import clean_env, wait_for
from tests.relay.metricskit import free_port

SECRET = "s3cret-Pa55"


def _record() -> logging.LogRecord:
    record = logging.makeLogRecord(
        {
            "name": "crossintercom.relay.inbound",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": "store %s unreachable",
            "args": (f"postgresql://relay:{SECRET}@db.example/mail",),
        }
    )
    record.__dict__.update(
        {"code": "store_unavailable", "host_id": "alice@laptop", "id": "m-1", "n": 3}
    )
    return record


def test_json_line_carries_the_fields_and_no_password() -> None:
    line = JsonFormatter().format(_record())
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["level"] == "WARNING"
    assert obj["logger"] == "crossintercom.relay.inbound"
    assert obj["event"] == "store postgresql://relay:***@db.example/mail unreachable"
    assert obj["time"].endswith("+00:00")
    assert (obj["code"], obj["host_id"], obj["id"], obj["n"]) == (
        "store_unavailable",
        "alice@laptop",
        "m-1",
        3,
    )


def test_text_line_masks_the_password_too() -> None:
    line = TextFormatter().format(_record())
    assert SECRET not in line
    assert line.startswith("WARNING crossintercom.relay.inbound: store postgresql://relay:***@")
    assert "code=store_unavailable" in line and "id=m-1" in line


@pytest.mark.parametrize(
    ("how", "expect_json"),
    [
        (("--log-format", "json"), True),
        (("CROSSINTERCOM_LOG_FORMAT=json",), True),
        ((), False),
    ],
)
def test_the_relay_logs_in_the_format_asked(how: tuple[str, ...], expect_json: bool) -> None:
    """A relay whose store does not answer logs its retries; the store URL's password never."""
    home = Path(tempfile.mkdtemp(prefix="lf-", dir="/tmp"))
    url = f"postgresql://relay:{SECRET}@127.0.0.1:{free_port()}/nothing"
    env = clean_env(CROSSINTERCOM_HOME=str(home), CROSSINTERCOM_HOST_ID="A")
    args = [sys.executable, "-m", "crossintercom", "relay", "--store", url]
    for item in how:
        if "=" in item:
            key, _, val = item.partition("=")
            env[key] = val
    if how and how[0] == "--log-format":
        args += list(how)
    log = home / "relay.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        wait_for(lambda: "retrying" in log.read_text(), 60, log.read_text)
    finally:
        proc.kill()
        proc.wait(10)
    text = log.read_text()
    assert SECRET not in text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if expect_json:
        for ln in lines:
            obj = json.loads(ln)
            assert {"time", "level", "logger", "event"} <= set(obj), obj
        assert any("retrying" in json.loads(ln)["event"] for ln in lines)
    else:
        assert any(ln.startswith("WARNING crossintercom.relay.run: ") for ln in lines), lines
