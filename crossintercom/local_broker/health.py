"""What `status` warns about: faults a host has right now, which it recovers from by itself.

A full disk under the runtime dir is read from the filesystem at each query; an inbox that
could not be written is what its client said in its last ack (``save_failed``), cleared by its
next successful one (docs/operations.md, "Degraded states").
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Final

from crossintercom.local_broker.outcomes import SAVE_FAILED

# Below this much free space, SQLite cannot be relied on to commit (a page, a journal).
LOW_SPACE_BYTES: Final = 256 * 1024
# A client whose inbox cannot be written is handed its mail again every few seconds; a report
# older than this means the session stopped trying (it left), so it is no longer shown.
UNWRITABLE_STALE_S: Final = 60.0


class Health:
    def __init__(self, home: Path) -> None:
        self.home = home
        # session id -> when its client last refused a message it could not save
        self._unwritable: dict[str, float] = {}

    def acked(self, session_id: str | None, refused: str | None) -> None:
        if session_id is None:
            return
        if refused == SAVE_FAILED:
            self._unwritable[session_id] = time.time()
        elif refused is None:
            self._unwritable.pop(session_id, None)

    def warnings(self, names: dict[str, str]) -> list[str]:
        """One line per fault; ``names`` gives a session's display name."""
        out: list[str] = []
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
        now = time.time()
        for session_id, when in sorted(self._unwritable.items()):
            if now - when > UNWRITABLE_STALE_S:
                continue
            name = names.get(session_id, session_id)
            out.append(
                f"inbox unwritable: {name} cannot save messages (full or read-only inbox); "
                "they stay queued until it can"
            )
        return out
