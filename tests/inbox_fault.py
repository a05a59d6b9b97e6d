"""A real fault on a host's inbox dir, for the tests of the long-running surfaces.

``immutable``: the sessions' inbox files made immutable (``chattr +i``: root ignores file modes,
and a read-only remount is refused while files are open for writing), the issue's case: a save
that fails half-way leaves a journal that only a write could roll back, so reads fail too.
``full``: the inbox dir is a small tmpfs, filled with a file, later removed. Both need root.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator
from pathlib import Path

import pytest

from crossintercom.tools.chaos.disk import chattr, fill, mount_tmpfs, unmount

KINDS = ("immutable", "full")
NEEDS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("chattr") is None, reason="needs root (mount, chattr)"
)


class InboxFault:
    def __init__(self, kind: str, inbox_dir: Path) -> None:
        self.kind = kind
        self.inbox_dir = inbox_dir
        self._held: list[Path] = []
        self._filler: Path | None = None
        self._mounted = False

    def prepare(self) -> None:
        """Before anything runs on the host: the inbox dir on its own small tmpfs."""
        if self.kind == "full":
            self.inbox_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            why = mount_tmpfs(self.inbox_dir)
            assert why is None, why
            self._mounted = True

    def on(self, *session_ids: str) -> None:
        if self.kind == "full":
            self._filler = fill(self.inbox_dir)
            return
        files = [self.inbox_dir / f"{sid}.sqlite" for sid in session_ids]
        assert all(f.exists() for f in files), files
        why = chattr("+i", *files)
        assert why is None, why
        self._held = files

    def off(self) -> None:
        if self._filler is not None:
            self._filler.unlink()
            self._filler = None
        if self._held:
            why = chattr("-i", *self._held)
            assert why is None, why
            self._held = []

    def close(self) -> None:
        self.off()
        if self._mounted:
            unmount(self.inbox_dir)
            self._mounted = False


def inbox_fault(kind: str, inbox_dir: Path) -> Generator[InboxFault, None, None]:
    """The body of a fixture: a prepared fault, always cleared and unmounted at the end."""
    fault = InboxFault(kind, inbox_dir)
    fault.prepare()
    try:
        yield fault
    finally:
        fault.close()
