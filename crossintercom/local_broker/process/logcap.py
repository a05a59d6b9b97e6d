"""A log file the broker keeps small by itself (capped at 8 KiB; docs/operations.md)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from crossintercom.runtime import open_file

LOG_CAP_BYTES = 8 * 1024


class CappedFileHandler(logging.Handler):
    """Appends records; when the file would pass the cap, keeps only its newest half."""

    def __init__(self, path: Path, cap: int = LOG_CAP_BYTES, gid: int | None = None) -> None:
        super().__init__()
        self.path = path
        self.cap = cap
        self.gid = gid

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode("utf-8", "replace")[: self.cap // 2]
            # Never through a symlink a member of a group runtime dir planted (runtime.open_file).
            fd = open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, gid=self.gid)
            try:
                trim_fd(fd, self.cap, len(line))
                os.write(fd, line)
            finally:
                os.close(fd)
        except Exception:
            self.handleError(record)


def trim_fd(fd: int, cap: int = LOG_CAP_BYTES, incoming: int = 0) -> None:
    """Keep the newest half of an append-mode log when ``incoming`` more bytes would pass
    ``cap``: the file stays bounded and its most recent lines (the failure) stay."""
    size = os.fstat(fd).st_size
    if size + incoming <= cap:
        return
    os.lseek(fd, max(0, size - cap // 2), os.SEEK_SET)
    tail = os.read(fd, cap)
    # Start at a line boundary so the kept half reads cleanly.
    cut = tail.find(b"\n")
    tail = tail[cut + 1 :] if cut >= 0 else b""
    os.ftruncate(fd, 0)
    os.write(fd, b"[log truncated to stay under 8 KiB]\n" + tail)


class ExtraFormatter(logging.Formatter):
    """Appends structured ``extra=`` fields as key=value."""

    _std = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in self._std}
        if extras:
            base += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return base
