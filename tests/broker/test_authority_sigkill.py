"""The dedup authority's records across a SIGKILL of the process holding it
(docs/delivery.md): what was written survives, a discard lost with the process only brings its
accepted record back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from crossintercom.local_broker.authority.dedup import Decision, DecisionKind, DedupAuthority
from tests.conftest import REPO

_CHILD = """
import sys
from pathlib import Path
from crossintercom.local_broker.authority.dedup import DecisionKind, DedupAuthority
auth = DedupAuthority(Path(sys.argv[1]))
assert auth.lodge("lodged-only", b"p").kind is DecisionKind.NEW
assert auth.lodge("accepted", b"q").kind is DecisionKind.NEW
auth.accept("accepted", {"id": "accepted", "outcome": "queued"})
print("ready", flush=True)
sys.stdin.read()
"""


def _kill_when_ready(script: str, directory: Path) -> None:
    """Run ``script`` on ``directory`` in a child process and SIGKILL it once it says ready."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(
        [sys.executable, "-c", script, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    ) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL


def test_records_survive_sigkill(tmp_path: Path) -> None:
    _kill_when_ready(_CHILD, tmp_path)
    with DedupAuthority(tmp_path) as auth:
        assert auth.lodge("lodged-only", b"p").kind is DecisionKind.UNCERTAIN
        assert auth.lodge("lodged-only", b"p", remote=True).kind is DecisionKind.FORWARD_AGAIN
        assert auth.lodge("accepted", b"q") == Decision(
            DecisionKind.RETAINED, {"id": "accepted", "outcome": "queued"}
        )


_RELEASE_CHILD = """
import sys
from pathlib import Path
from crossintercom.local_broker.authority.dedup import DecisionKind, DedupAuthority
auth = DedupAuthority(Path(sys.argv[1]))
for op_id in ("carried", "pending"):
    assert auth.lodge(op_id, b"p").kind is DecisionKind.NEW
    auth.accept(op_id, {"id": op_id, "outcome": "delivered"})
auth.discard("carried")
assert auth.lodge("next", b"n").kind is DecisionKind.NEW  # carries the DELETE of "carried"
auth.discard("pending")  # nothing writes after it
# discarded: unknown at once, in memory
assert auth.lodge("pending", b"p").kind is DecisionKind.NEW
auth.abandon("pending")  # the DELETE of the discard and of the abandon, one transaction
assert auth.lodge("kept", b"k").kind is DecisionKind.NEW
auth.accept("kept", {"id": "kept", "outcome": "delivered"})
auth.discard("kept")
print("ready", flush=True)
sys.stdin.read()
"""


def test_batched_discard_after_sigkill(tmp_path: Path) -> None:
    """A discard's DELETE rides in the next write; one lost with the process only brings the
    accepted record back (a duplicate is suppressed a little longer, never let through)."""
    _kill_when_ready(_RELEASE_CHILD, tmp_path)
    with DedupAuthority(tmp_path) as auth:
        assert auth.lodge("carried", b"other").kind is DecisionKind.NEW
        assert auth.lodge("pending", b"other").kind is DecisionKind.NEW
        assert auth.lodge("next", b"n").kind is DecisionKind.UNCERTAIN
        assert auth.lodge("kept", b"k") == Decision(
            DecisionKind.RETAINED, {"id": "kept", "outcome": "delivered"}
        )
