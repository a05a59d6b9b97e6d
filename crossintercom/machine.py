"""This machine's identity for the host row, kept in the runtime dir (docs/operations.md,
"Files in the runtime dir")."""

from __future__ import annotations

import os
import re
import socket
import uuid

from crossintercom.config import Settings
from crossintercom.errors import RuntimeDirError
from crossintercom.runtime import group_gid, modes, open_file, replace_file

MACHINE_FILE = "machine.id"
# ``hostname/`` + 12 hex digits: printable ASCII without spaces, short enough for the host
# row (docs/operations.md, "Files in the runtime dir").
MACHINE_SHAPE = re.compile(r"[!-~]{1,200}/[0-9a-f]{12}")
_MACHINE_READ = 512


def machine_identity(settings: Settings) -> str:
    """This machine's identity for the host row: ``hostname/random``, kept in the runtime dir.

    Two runtime dirs (two machines, a cloned VM with a fresh dir) get two identities, so a
    host id configured on both is named as a collision (docs/operations.md). A clone that
    copied the runtime dir copies this file too: delete it there. The file is read without
    following a symlink and must have the shape the relay writes: anything else is refused,
    never published in the store.
    """
    path = settings.file(MACHINE_FILE)
    gid = group_gid(settings)
    try:
        fd = open_file(path, os.O_RDONLY, gid=gid)
    except FileNotFoundError:
        fd = -1
    if fd >= 0:
        try:
            raw = os.read(fd, _MACHINE_READ)
        finally:
            os.close(fd)
        found = raw.decode("ascii", "replace").strip()
        if found:
            if len(raw) >= _MACHINE_READ or not MACHINE_SHAPE.fullmatch(found):
                raise RuntimeDirError(
                    f"{path} does not hold a machine identity (hostname/12 hex digits); "
                    "delete it and the relay makes a new one",
                    path=str(path),
                )
            return found
    host = "".join(ch for ch in socket.gethostname() if "!" <= ch <= "~")[:200] or "host"
    ident = f"{host}/{uuid.uuid4().hex[:12]}"
    replace_file(path, (ident + "\n").encode(), modes(settings)[1], gid=gid)
    return ident
