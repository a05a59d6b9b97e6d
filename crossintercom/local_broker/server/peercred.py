"""Who may connect to the broker socket: SO_PEERCRED, checked on every accepted connection.

Per-user mode: only the user the broker runs as. Host-wide group mode (CROSSINTERCOM_GROUP):
members of that group too (primary or supplementary, as the kernel reports them for the peer's
process). The socket's file modes say the same; this check still holds when they are wrong (a
chmod, a bind mount), and says who was turned away (docs/operations.md).
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

_UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return Peer(*_UCRED.unpack(raw))


def _groups_of(pid: int) -> set[int]:
    """The peer process's supplementary groups (empty if it is already gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


def refusal(peer: Peer, group_gid: int | None) -> str | None:
    """Why ``peer`` may not connect, or None when it may."""
    if peer.uid == os.geteuid():
        return None
    if group_gid is not None and (peer.gid == group_gid or group_gid in _groups_of(peer.pid)):
        return None
    who = "the owning user" if group_gid is None else f"the owning user or group {group_gid}"
    return f"peer pid {peer.pid} uid {peer.uid} gid {peer.gid} is not {who}"
