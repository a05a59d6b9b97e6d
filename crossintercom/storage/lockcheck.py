"""Do the byte-range locks of the SQLite store's filesystem exclude across hosts? A cross-host
check, run by every relay before it opens the store and on every beat after (docs/storage.md,
"The lock beacon").

SQLite keeps two writers apart with fcntl locks on the store file. Where the filesystem does not
carry them between machines (NFS mounted ``nolock``, sshfs, an SMB share without byte-range
locks, two FUSE mounts of one directory), two relays write at once and pages of different rows
mix: the store is damaged and mail is lost. One mount cannot see that alone, so the relays look
at each other through a directory beside the store (``<store>.locks``):

- each relay takes an fcntl write lock on one byte of ``beacon`` (an offset of its own, drawn
  at random) and holds it while it runs, then writes a record file, ``<nonce>-<offset>``, whose
  content (a beat counter and its host id) it rewrites every ``BEAT_S``;
- every relay probes the bytes the other records name (``F_GETLK``). Where locks exclude, each is
  held, and that is all the check costs: a directory listing and one lock query per peer;
- a byte found free belongs to a relay that stopped (the kernel released its lock) or to one
  whose lock this mount cannot see. The record tells them apart: its counter moving after the
  probe proves the holder alive, and a live holder never released its byte. Then the locks do
  not exclude, and the check refuses. A record still for ``STALE_S`` is a dead relay's, removed.

The refusal is kept in this process (``refusal``) and the store's driver runs no transaction
while one stands (``storage.driver``). A relay that refuses keeps beating, so its peers find
the same thing when they probe it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from crossintercom.runtime import replace_file
from crossintercom.storage import sqlitetrust

log = logging.getLogger(__name__)

BEAT_S: Final = 1.0
# A record whose counter has not moved for this long on the observer's clock is a dead relay's.
STALE_S: Final = 4 * BEAT_S
# Offsets are drawn from [1, 2**31): a 32-bit off_t and every network lock protocol reach them.
_OFFSETS: Final = 2**31 - 1
_RECORD_MODE: Final = 0o640

# The refusals of this process, by the store file's real path (the driver's gate).
_refused: dict[str, str] = {}
_refused_lock = threading.Lock()


def beacon_dir(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".locks")


def _key(db_path: Path) -> str:
    return os.path.realpath(db_path)


def refusal(db_path: Path) -> str | None:
    """Why this process must not write the store at ``db_path``, or None."""
    if not _refused:
        return None
    with _refused_lock:
        return _refused.get(_key(db_path))


def refuse(db_path: Path, why: str) -> None:
    with _refused_lock:
        _refused.setdefault(_key(db_path), why)


def advice(db_path: Path, found: str) -> str:
    """The refusal as `status`, the log and the overseer page say it."""
    return (
        f"REFUSED: byte-range locks on the filesystem of {db_path} do not exclude across "
        f"hosts ({found}); this relay does not write the store, which two writers would "
        "damage, and sends to other hosts answer not_sent (store_locks_unsafe). Put the store "
        "on a filesystem whose locks work across machines (NFS with its lock manager, "
        'not "nolock"; SMB with byte-range locks), or use PostgreSQL, then restart the '
        'relays (docs/operations.md, "Shared filesystems")'
    )


@dataclass(slots=True)
class _Suspect:
    """A peer whose byte was found free: its counter as first read after the probe."""

    content: bytes
    since: float


def _lock_query(fd: int, offset: int) -> bool:
    """True when some other process holds a lock that conflicts with a write lock on the byte
    (F_GETLK: nothing is taken)."""
    # struct flock: l_type, l_whence (shorts), l_start, l_len (off_t), l_pid (pid_t)
    fmt = "hhqqi4x"
    query = struct.pack(fmt, fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    got = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    return bool(struct.unpack(fmt, got)[0] != fcntl.F_UNLCK)


def _host_of(content: bytes) -> str:
    """The host id a record names (its second line)."""
    lines = content.decode(errors="replace").splitlines()
    return lines[1] if len(lines) > 1 else "?"


def _parse_name(name: str) -> int | None:
    nonce, sep, offset = name.partition("-")
    if not sep or not nonce.isalnum() or not offset.isdigit():
        return None
    value = int(offset)
    return value if 0 < value <= _OFFSETS else None


class LockBeacon:
    """One relay's part in the check (see the module's docstring)."""

    def __init__(self, db_path: Path, host_id: str) -> None:
        self.db_path = db_path
        self.host_id = host_id
        self.dir = beacon_dir(db_path)
        self.offset = 1 + secrets.randbelow(_OFFSETS - 1)
        self.name = f"{secrets.token_hex(8)}-{self.offset}"
        self._fd = -1
        self._beat = 0
        self._suspects: dict[str, _Suspect] = {}
        self._last_beat = 0.0
        # Set once the locks were shown not to exclude: the text of the refusal.
        self.refused: str | None = None

    @property
    def started(self) -> bool:
        return self._fd >= 0

    # --- own byte and record ------------------------------------------------------------------

    def _open(self) -> None:
        sqlitetrust.private_dir(self.dir, sqlitetrust.configured_gid())
        _, mode = sqlitetrust.modes(sqlitetrust.configured_gid() is not None)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd = os.open(self.dir / "beacon", flags, mode)
        # Held for the life of the process. A byte someone else holds (the same offset drawn
        # twice, on a filesystem whose locks work) moves this relay to another.
        for _ in range(8):
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self.offset)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise  # not a byte someone holds: no locks here at all (ENOLCK), say
                self.offset = 1 + secrets.randbelow(_OFFSETS - 1)
                self.name = f"{self.name.partition('-')[0]}-{self.offset}"
        raise OSError(f"no free byte in {self.dir / 'beacon'} to lock")

    def _write_record(self) -> None:
        self._beat += 1
        data = f"{self._beat}\n{self.host_id}\n".encode()
        replace_file(self.dir / self.name, data, _RECORD_MODE, gid=sqlitetrust.configured_gid())

    def close(self) -> None:
        """Remove the record, then release the byte (a clean stop leaves nothing to probe)."""
        with contextlib.suppress(OSError):
            (self.dir / self.name).unlink()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # --- the check ----------------------------------------------------------------------------

    def start(self) -> str | None:
        """Take this relay's byte, publish its record, and probe every peer; a peer found free
        is watched (up to STALE_S) until it is shown alive (refused) or dead. Returns the
        refusal, or None: the store may be opened for writing."""
        try:
            self._open()
        except OSError as exc:
            if exc.errno != errno.ENOLCK:
                raise
            # NFS without its lock manager, say: SQLite could not keep writers apart either.
            self.refused = advice(self.db_path, "the filesystem grants no byte-range locks")
            refuse(self.db_path, self.refused)
            return self.refused
        self._write_record()
        self._last_beat = time.monotonic()
        deadline = time.monotonic() + STALE_S + BEAT_S
        self.tick(beat=False)
        while self._suspects and self.refused is None and time.monotonic() < deadline:
            time.sleep(BEAT_S / 4)
            self.tick(beat=time.monotonic() - self._last_beat >= BEAT_S)
        return self.refused

    def tick(self, *, beat: bool = True) -> str | None:
        """One round: rewrite this relay's record, probe the peers; the refusal, if any."""
        if beat:
            try:
                self._write_record()
            except OSError as exc:
                log.warning("the lock beacon's record was not rewritten: %s", exc)
            self._last_beat = time.monotonic()
        try:
            names = [n for n in os.listdir(self.dir) if n != self.name and not n.startswith(".")]
        except OSError as exc:
            log.warning("the lock beacon %s is unreadable: %s", self.dir, exc)
            return self.refused
        now = time.monotonic()
        for name in self._suspects.keys() - set(names):
            del self._suspects[name]  # removed: its relay stopped cleanly
        for name in names:
            offset = _parse_name(name)
            if offset is None:
                continue
            self._probe(name, offset, now)
            if self.refused is not None:
                break
        return self.refused

    def _read(self, name: str) -> bytes | None:
        try:
            with open(self.dir / name, "rb") as f:
                return f.read(512)
        except OSError:
            return None

    def _probe(self, name: str, offset: int, now: float) -> None:
        suspect = self._suspects.get(name)
        if suspect is None:
            if _lock_query(self._fd, offset):
                return  # held, as it should be: the usual case, and the whole cost
            content = self._read(name)
            if content is not None and _host_of(content) == self.host_id:
                # This host id's previous relay: one runs per host id per machine (relay.lock),
                # so it is dead, and nobody need wait on its record.
                with contextlib.suppress(OSError):
                    (self.dir / name).unlink()
            elif content is not None:
                self._suspects[name] = _Suspect(content, now)
            return
        content = self._read(name)
        if content is None:
            del self._suspects[name]
            return
        if content != suspect.content:
            # Written after the probe found its byte free: its relay is alive and holds the
            # byte, yet this mount could take it.
            found = (
                f"a byte that host {_host_of(content)!r}'s running relay holds was free to "
                f"host {self.host_id!r}'s relay"
            )
            self.refused = advice(self.db_path, found)
            refuse(self.db_path, self.refused)
            log.error("%s", self.refused)
            return
        if now - suspect.since >= STALE_S:
            # A dead relay's record (its lock went with it): removed, so nobody waits on it.
            del self._suspects[name]
            with contextlib.suppress(OSError):
                (self.dir / name).unlink()
