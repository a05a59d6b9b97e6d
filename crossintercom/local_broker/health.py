"""What `status` warns about: faults a host has right now, which it recovers from by itself.

A full disk under the runtime dir is read from the filesystem at each query. A session's inbox
that fails is known two ways: its client's last ack refused a message it could not save
(``save_failed``, cleared by its next successful one), and its client's ``inbox_fault`` report
(reading or writing fails since a time; held while that connection lasts). Both are shown with
when the fault began (docs/operations.md, "Degraded states"; docs/reliability.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from crossintercom import protocol as p
from crossintercom.errors import Code
from crossintercom.runtime import runtime_dir_too_small

# Below this much free space, SQLite cannot be relied on to commit (a page, a journal).
LOW_SPACE_BYTES: Final = 256 * 1024
# A client whose inbox cannot be written is handed its mail again every few seconds; a report
# older than this means the session stopped trying (it left), so it is no longer shown.
UNWRITABLE_STALE_S: Final = 60.0


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Health:
    def __init__(self, home: Path) -> None:
        self.home = home
        # session id -> (since, last): its client refuses messages it cannot save since `since`,
        # the latest at `last`
        self._unwritable: dict[str, tuple[float, float]] = {}
        # connection -> (session id, what its client says fails in its inbox)
        self._reported: dict[object, tuple[str, list[p.InboxFaultItem]]] = {}

    def acked(self, session_id: str | None, refused: str | None) -> None:
        if session_id is None:
            return
        if refused == Code.SAVE_FAILED:
            now = time.time()
            since, last = self._unwritable.get(session_id, (now, now))
            if now - last > UNWRITABLE_STALE_S:
                since = now
            self._unwritable[session_id] = (since, now)
        elif refused is None:
            self._unwritable.pop(session_id, None)

    def reported(
        self, conn: object, session_id: str | None, faults: Sequence[p.InboxFaultItem]
    ) -> None:
        """A client's report of its inbox faults (none: it works); a closed one says none."""
        if faults and session_id is not None:
            self._reported[conn] = (session_id, list(faults))
        else:
            self._reported.pop(conn, None)

    def _inbox_faults(self) -> dict[str, dict[str, tuple[float, str]]]:
        """session id -> op -> (since, error), from both sources, the earliest start kept."""
        out: dict[str, dict[str, tuple[float, str]]] = {}
        now = time.time()
        for session_id, (since, last) in self._unwritable.items():
            if now - last <= UNWRITABLE_STALE_S:
                out.setdefault(session_id, {})["write"] = (since, "")
        for session_id, items in self._reported.values():
            ops = out.setdefault(session_id, {})
            for item in items:
                since, error = ops.get(item.op, (item.since, ""))
                ops[item.op] = (min(since, item.since), error or item.error)
        return out

    def warnings(self, names: dict[str, str]) -> list[str]:
        """One line per fault; ``names`` gives a session's display name."""
        out: list[str] = []
        if (small := runtime_dir_too_small(self.home)) is not None:
            out.append(small)
        try:
            st = os.statvfs(self.home)
        except OSError as exc:
            out.append(f"runtime dir unreadable: {exc.strerror}")
        else:
            free = st.f_bavail * st.f_frsize
            if free < LOW_SPACE_BYTES:
                out.append(
                    f"disk full: {free} bytes free under {self.home}; messages for this host "
                    "wait (queued) until space is freed"
                )
        for session_id, ops in sorted(self._inbox_faults().items()):
            name = names.get(session_id, session_id)
            if "write" in ops:
                since, error = ops["write"]
                why = f" ({error})" if error else " (full or read-only inbox)"
                out.append(
                    f"inbox unwritable: {name} cannot save messages since {_when(since)}{why}; "
                    "they stay queued until it can"
                )
            if "read" in ops:
                since, error = ops["read"]
                out.append(
                    f"inbox unreadable: {name} cannot read its inbox since {_when(since)} "
                    f"({error}); saved messages wait unshown until it can"
                )
        return out
