"""CPU seconds spent on a phase of the bench, summed over every process on the path.

A wall-clock figure on a shared machine carries whatever else the cores were doing; the CPU
the path itself used does not. ``CpuAccount`` reads ``utime + stime`` from ``/proc/PID/stat``
before and after a phase for every process of the run (those whose ``CROSSINTERCOM_HOME`` lies
under the bench's directory: relays, brokers, listeners), the thread that runs the bench's
clients (the senders; the bench's own polling runs on worker threads and is left out), and the
PostgreSQL backends of the store's database (``pg_stat_activity`` pids, when the server runs on
this machine so that its ``/proc`` entries are readable). A process that starts or ends inside
the phase is counted for the part of it seen at either end. See docs/performance.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from crossintercom.config import ENV_HOME

_TICK = os.sysconf("SC_CLK_TCK")
# Roles by what the process runs (its command line), for the per-role breakdown.
_ROLES = (("crossintercom.relay", "relay"), ("broker", "broker"), ("listen", "listener"))


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _environ_home(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{ENV_HOME}=".encode()
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def _role(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "other"
    return next((role for needle, role in _ROLES if needle in cmd), "other")


def run_processes(root: Path) -> dict[int, str]:
    """Every process (pid -> role) whose runtime dir is ``root`` or lies under it."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        home = _environ_home(int(entry.name))
        if home is not None and (home == str(root) or home.startswith(f"{root}/")):
            found[int(entry.name)] = _role(int(entry.name))
    return found


def server_backends(conninfo: str) -> list[int] | None:
    """The pids of the PostgreSQL backends on the store's database, or None when they cannot
    be read here (a server on another machine, or its processes not visible)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    local = [int(r[0]) for r in rows if _comm(int(r[0])) == "postgres"]
    return local or None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@dataclass
class CpuSample:
    """CPU seconds by role at one moment; the clients' thread under ``senders``."""

    by_pid: dict[int, tuple[str, float]] = field(default_factory=dict)
    senders: float = 0.0


@dataclass
class CpuAccount:
    """Take ``start()`` in the clients' thread before a phase and ``stop(messages)`` there after
    it: CPU milliseconds per message by role and in total. ``processes`` names the processes to
    count (pid -> role) each time it is asked; ``conninfo`` adds the backends of its database."""

    processes: Callable[[], dict[int, str]]
    conninfo: str | None = None
    _before: CpuSample | None = None

    def _sample(self, *, senders_first: bool) -> CpuSample:
        # The clients' thread is read on the phase's side of this scan, so the scan's own CPU
        # is not counted as the senders'.
        sample = CpuSample(senders=time.thread_time() if senders_first else 0.0)
        pids = dict(self.processes())
        if self.conninfo is not None:
            for pid in server_backends(self.conninfo) or []:
                pids[pid] = "server"
        for pid, role in pids.items():
            cpu = process_cpu(pid)
            if cpu is not None:
                sample.by_pid[pid] = (role, cpu)
        if not senders_first:
            sample.senders = time.thread_time()
        return sample

    def start(self) -> None:
        self._before = self._sample(senders_first=False)

    def stop(self, messages: int) -> dict[str, float]:
        """ms of CPU per message by role, and ``total``."""
        before, after = self._before, self._sample(senders_first=True)
        assert before is not None, "start() first"
        used: dict[str, float] = {"senders": after.senders - before.senders}
        for pid, (role, cpu) in after.by_pid.items():
            was = before.by_pid.get(pid, (role, 0.0))[1]
            used[role] = used.get(role, 0.0) + max(0.0, cpu - was)
        per = {k: round(v * 1000 / max(1, messages), 3) for k, v in sorted(used.items())}
        per["total"] = round(sum(used.values()) * 1000 / max(1, messages), 3)
        return per
